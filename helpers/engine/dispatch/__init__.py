"""The driver's decisions; imports ``contract``, ``measure`` and ``workers``.

- ``reader``: records from the source into workunits;
- ``scheduler``: which workunit goes to which worker, applying ``recovery``'s decisions when one
  fails or its worker dies; ``slots``: a worker slot as the scheduler sees it (its state, what it
  holds);
- ``growth``: workers per device (``workers="auto"``);
- ``probe``: can every worker reach the input and the output.
"""
