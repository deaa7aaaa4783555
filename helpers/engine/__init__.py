"""The engine: the queue-worker implementation, imported by the workloads (``contract.protocol``
only), the study, the CLI and the benchmarks, and importing none of them. Its rooms, bottom to top;
each imports only itself and the rooms its ``__init__`` names:

- ``contract``: what every room shares (protocol, messages, settings, devices, ids, fingerprint);
- ``measure``: workunit sizes, device telemetry, a run's statistics;
- ``inputs``: sources and the readers a worker runs on its own rows;
- ``outputs``: parts, their index, ownership, exports;
- ``workers``: the worker loop and the backends that run it (process, thread, Ray);
- ``dispatch``: the driver's decisions (reader, taker, scheduler, failures, growth, probe);
- on top: ``pool`` (workers started once, running jobs), ``job`` (one job's loop and its
  stats), and ``pipeline``, drawing the data flow and running a job on a pool of its own.
"""
