"""Measuring a run; imports ``contract`` only (the names its measurements had before).

- ``sizing``: workunit sizes from measured rates;
- ``telemetry``: were the devices fed (utilization and memory, sampled beside a run);
- ``stats``: a run's and each worker's statistics.
"""
