"""Capture: a step's real inputs per module, their copies, the component tree, and which calls the backward reached.

Takes the user's model and one step; gives ``Capture`` (every call's inputs), the tree of
components (``tree.py``), input copies for replay (``inputs.py``), storage identity
(``storage.py``) and the autograd reach of each call (``reach.py``).
"""
