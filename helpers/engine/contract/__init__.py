"""What every room of the engine shares, and what a workload sees of it; imports no other room.

- ``protocol``: what a workload and a source give the engine (``Workload``, ``Source``, ``Rows``);
- ``messages``: what travels between the driver and its workers;
- ``settings``: a job's and a pool's settings; ``devices``: the cards and cores a run sees;
- ``id_ranges``: record ids as ranges; ``fingerprint``: what made an output;
- ``versions``: the packages a run used; ``renamed``: names an older gpufeed wrote, and what
  they are called now.
"""
