"""The engine: the queue-worker implementation, imported by the workloads (``protocol`` only), the
study, the CLI and the benchmarks, and importing none of them.

Bottom to top: ``protocol`` (what a workload gives the engine), ``messages`` (what travels
between parent and workers), ``settings`` and ``devices``; ``id_ranges``, ``sources`` and
``reader`` (records in); ``transfer``, ``worker``, ``backends`` and ``ray_backend`` (where
workers run; only the last imports Ray);
``scheduler`` (which workunit goes where, and recovery); ``checkpoint`` and ``hdf5_sink`` (results
out, crash-safe); ``stats`` and ``versions``; ``pipeline`` on top, drawing the data flow.
"""
