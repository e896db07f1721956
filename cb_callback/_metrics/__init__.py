"""Built-in metric plugins, written against the contracts a user's plugin gets (``cb_callback._engine.run.plugins``)."""
