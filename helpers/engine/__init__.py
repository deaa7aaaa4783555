"""The engine: the queue-worker implementation, imported by the workloads (``protocol`` only), the
study, the CLI and the benchmarks, and importing none of them. Its modules, bottom to top:

- what is shared: ``protocol`` (what a workload and a source give the engine), ``messages`` (what
  travels between parent and workers), ``settings``, ``devices``, ``versions``;
- records in: ``id_ranges``, ``id_checks``, ``sources``, ``jsonl``, ``csv_scan`` (where a CSV's
  rows are, unparsed), ``table_files``, ``tables``, ``table_rows``, ``jsonl_rows`` and
  ``csv_rows`` (a worker reading its own rows), ``carried`` (a source's columns to the output),
  ``fingerprint`` (what made an output), ``reader`` (records into workunits);
- where workers run: ``transfer``, ``worker``, ``backends``, ``preload`` (what the fork server
  imports), ``ray_backend`` (the only one that imports Ray), ``probe`` (can every worker reach
  the input and the output);
- deciding: ``scheduler`` (which workunit goes where, and recovery), ``sizing`` (workunit sizes
  from measured rates), ``growth`` (workers per device), ``telemetry`` (were the devices fed);
- results out: ``atomic`` (files whole or not at all), ``ownership`` (one run per output, nothing
  replaced without asking), ``run_log`` (each finished run's record, kept in its output),
  ``checkpoint`` and ``hdf5_sink`` (crash-safe parts and their index),
  ``export`` (Parquet, NumPy), ``stats``;
- ``pipeline`` on top, drawing the data flow.
"""
