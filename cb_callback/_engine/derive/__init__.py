"""Derivation: the numbers computed from measured ones, and how far to trust them.

Takes measured rows; gives parents estimated from children (``estimate.py``), the
roll-up of rates and shares (``rollup.py``), plugin parts (``parts.py``), quality flags and
the verdict (``quality.py``) and its advice (``advice.py``).
"""
