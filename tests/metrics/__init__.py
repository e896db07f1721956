"""Tests of the built-in metric plugins (cb_callback/_metrics)."""
