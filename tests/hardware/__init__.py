"""Tests of peaks and calibration (cb_callback/_hardware)."""
