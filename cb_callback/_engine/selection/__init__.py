"""Selection: which components a run replays, which take a representative's row, which stay in situ.

Takes in-situ times and the census; gives the triage's plan (``triage.py``, under ranks
``ranked_triage.py``), the levels to descend (``descend.py``) and repeated structure
(``groups.py``).
"""
