"""What the Advisor Controller's oldest Python (3.9) lacks of the 3.11 standard library.

The controller's own distribution (``deploy/controller-wheel/pyproject.toml``) ships this package to
login nodes that run old distributions; the control plane runs 3.11, where these are the
standard library's own names.
"""

from __future__ import annotations

import sys
from datetime import timezone

# datetime.UTC (3.11) is this very object.
UTC = timezone.utc

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:
    from enum import Enum

    class StrEnum(str, Enum):
        """3.11's ``enum.StrEnum``: members are strings, and ``str()`` and ``format()`` give
        the value, not ``Class.MEMBER``."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, format_spec: str) -> str:
            return str(self.value).__format__(format_spec)


__all__ = ["UTC", "StrEnum"]
