"""Verbs of this area are registered here."""


def register(sub) -> None:
    """Add this area's verbs to the `attnlab` sub-parsers."""
