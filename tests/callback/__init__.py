"""Tests of the Lightning callback (cb_callback/_lightning).

Not named ``lightning``: the scripts run from tests/ would import it instead of Lightning.
"""
