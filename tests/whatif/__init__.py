"""Tests of the what-ifs (cb_callback/_whatif)."""
