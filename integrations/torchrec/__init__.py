"""torchrec integration."""
