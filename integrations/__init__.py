"""Optional integrations (torchrec, ...); import each submodule explicitly."""
