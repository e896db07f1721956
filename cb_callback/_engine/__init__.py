"""The engine: capture a step, replay each component in isolation, measure, roll up.

Nothing here imports Lightning or the reporters.
"""
