"""Tests of the engine (cb_callback/_engine)."""
