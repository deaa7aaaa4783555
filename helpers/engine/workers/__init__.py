"""Where workers run; imports ``contract`` and ``outputs`` (a worker writes its own parts).

- ``worker``: the worker loop, the only module of the engine a worker process needs;
- ``transfer``: arrays between processes; ``backends``: process and thread workers;
- ``ray_backend``: workers as Ray actors (the only module that imports Ray);
- ``preload``: what the fork server imports.
"""
