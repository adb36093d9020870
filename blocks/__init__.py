"""Token-mixing blocks for hybrid sequence models.

``blocks.names()`` lists the registered mixers, ``blocks.build(name, d_model=..., **config)``
constructs one. The functional math lives in ``blocks.ops`` (one module per family, named like
flash-linear-attention's); ``blocks/README.md`` documents every op and block.
"""
from .registry import UnknownBlockError, build, get, names, register

__all__ = ["build", "get", "names", "register", "UnknownBlockError"]
