"""Several ranks: replays that communicate, run on every rank together, and their collectives.

Takes a model under a process group; gives the ranks' agreement points (``coordinator.py``),
the lockstep replay (``lockstep.py``, ``ledger.py``), the collectives counted and timed
(``comm.py``), the modules refused alone (``collectives.py``) and FSDP2 units (``fsdp.py``).
"""
