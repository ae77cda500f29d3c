"""Interventions: test what attention does, not only show it."""
