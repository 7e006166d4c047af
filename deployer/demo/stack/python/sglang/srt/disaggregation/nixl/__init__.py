"""The NIXL-style KV-transfer backend (simulated: chunks are sleeps)."""
