"""deployer: ship a source patch to a serving host and prove it."""

from deployer.codetable import installed
from deployer.lean import pydantic_without_asyncio, yaml_reader_at_once

__version__ = "0.1.0"

pydantic_without_asyncio()
yaml_reader_at_once()
installed()
