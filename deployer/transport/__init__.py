"""Transports: how deployer runs commands and moves bytes on a target."""
