"""The model of results (``Report``), its renderers (table, icicle, html) and reporters
(files, TensorBoard), the TensorBoard plugin and ``cb diff``'s comparison.

Nothing here imports the engine.
"""
