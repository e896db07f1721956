"""Tests of the cb command (cb_callback/_cli.py)."""
