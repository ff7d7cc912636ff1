"""Failure detection. Pure Python: nothing in this package imports Django."""
