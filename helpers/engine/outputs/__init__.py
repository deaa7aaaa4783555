"""Results out: crash-safe, owned by one run, nothing replaced without asking; imports
``contract`` only.

- ``atomic``: files whole or not at all;
- ``run_log``: each finished run's record, kept in its output;
- ``checkpoint``: the parts a run writes (``Parts``) and their ``Index``; ``hdf5_sink``: the
  driver's writer;
- ``ownership``: one run per output;
- ``export``: Parquet and NumPy from an output.
"""
