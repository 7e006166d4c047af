"""HTTP entry points of the demo servers."""
