"""Prefill/decode disaggregation: KV-transfer state and the queues around it."""
