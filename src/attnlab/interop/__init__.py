"""Bridges to other libraries' model formats (Hugging Face)."""
