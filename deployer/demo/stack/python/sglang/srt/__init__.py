"""The serving runtime of the demo stack."""
