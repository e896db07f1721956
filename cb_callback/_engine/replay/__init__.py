"""Replay: one component alone on its captured inputs, and everything profiling could change put back.

Takes a component and its captured inputs; gives its forward/backward passes
(``isolate.py``), the state guard (``state.py``), the calls one replay runs
(``callset.py``), many batches as one row (``batches.py``) and the built-in
preprocessors (``preprocessors.py``).
"""
