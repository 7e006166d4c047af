"""Bookkeeping shared by every KV-transfer backend."""
