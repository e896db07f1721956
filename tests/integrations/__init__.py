"""Tests of the torchrec integration (integrations/torchrec)."""
