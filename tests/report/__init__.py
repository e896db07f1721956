"""Tests of the results model and its renderers (cb_callback/_report)."""
