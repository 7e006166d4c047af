"""Interfaces shared by every KV-transfer backend."""
