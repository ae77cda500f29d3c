"""Bridges to other libraries' model formats (Hugging Face)."""

# the families with a module of their own add their loaders to hf.LOADERS
from attnlab.interop import t5, vit  # noqa: E402,F401
