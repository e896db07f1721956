"""Tests of cb_callback/_engine/selection."""
