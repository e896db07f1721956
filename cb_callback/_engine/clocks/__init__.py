"""Clocks: timing a callable, the harness floor, and every module's time inside the real step.

Takes callables and a captured step; gives samples with their spread
(``timing.py``), the harness's fixed cost (``floor.py``), hook and autograd-node clocks
(``clock.py``, ``nodeclock.py``) and the in-situ pass (``insitu.py``).
"""
