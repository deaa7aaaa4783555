"""The driver's decisions; imports ``contract``, ``measure`` and ``workers``.

- ``reader``: records from the source, queued ahead of the scheduler;
- ``taker``: what a workunit holds: each worker's size, taken from the reader, joined, cut,
  numbered; the workunits waiting to go again;
- ``scheduler``: which workunit goes to which worker: slots, messages, events; ``slots``: a worker
  slot as the scheduler sees it (its state, what it holds);
- ``failures``: what the scheduler does when a workunit fails or its worker dies or hangs,
  applying ``recovery``'s decisions;
- ``growth``: workers per device (``workers="auto"``, and ``"fit"``'s);
- ``probe``: can every worker reach the input and the output.
"""
