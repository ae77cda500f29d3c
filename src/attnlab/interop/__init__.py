"""Bridges to other libraries' model formats (Hugging Face): one module per family (gpt2.py,
bert.py, decoders.py, t5.py, vit.py), each registering a ``hf.Family`` that ``hf.families()``
finds; to add a family, add a module here (see ``attnlab.interop.hf``)."""
