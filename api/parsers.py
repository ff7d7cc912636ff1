"""Request body parsers of the API."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser; a body nested deeper than Python's JSON reader can follow is a 400.

    The reader recurses once per level of lists and objects, so a body of ``[[[[...`` a few
    thousand levels deep raises RecursionError, which DRF would answer as a server error.
    Shallower nesting is parsed and left to each field's limits (``recovery/audit/limits.py``).
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("The body is not usable JSON: it is nested too deeply.") from None
