"""Talking to schedulers safely: node lists, identifiers, job opt-in. Pure Python, no Django."""
