"""The Lightning wing: the ``ComponentBenchmark`` callback and what it needs (when to capture,
where results go, the fork-mode child). Only ``callback.py`` imports Lightning.
"""
