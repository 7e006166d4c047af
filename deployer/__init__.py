"""deployer: ship a source patch to a serving host and prove it."""

__version__ = "0.1.0"
