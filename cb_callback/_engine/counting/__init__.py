"""Counting: FLOPs and bytes per op, and the census that charges each op of the step to its modules.

Takes the captured step's top components; gives every module's counts from one
instrumented pass (``census.py``) with the FLOP rules (``flop_rules.py``) and byte rules
(``byte_rules.py``) that the FLOP and traffic metrics share.
"""
