"""Tests of the Lightning callback (cb_callback/_lightning)."""
