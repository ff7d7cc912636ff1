"""A clock the demo history sets to a story's time while the loop's own functions record it.

The loop stamps what it records with ``django.utils.timezone.now()``, either by calling it or
through model field defaults that hold a reference to it. Both end in ``datetime.now`` as seen
from ``django.utils.timezone``, so that is the one name replaced while a story's clock is set.
The story's time is kept in a context variable: other threads, and code outside ``story_clock``,
keep reading the real time even while the replacement is installed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, tzinfo

from django.utils import timezone as django_timezone

_story_time: ContextVar[datetime | None] = ContextVar("demo_story_time", default=None)
_install_lock = threading.Lock()
_installed = 0
# The name ``timezone.now()`` looks ``datetime`` up by in its module, at each call.
_REPLACED = "datetime"
_real_datetime: type[datetime] = getattr(django_timezone, _REPLACED)


class _StoryDatetime(datetime):
    """``datetime`` whose ``now()`` is the story's time where one is set."""

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> datetime:  # type: ignore[override]
        at = _story_time.get()
        if at is None:
            return _real_datetime.now(tz)
        return at.astimezone(tz) if tz is not None else at


@contextmanager
def story_clock(at: datetime) -> Iterator[None]:
    """Within the block, ``timezone.now()`` is ``at`` in this thread (``at`` must be aware)."""
    global _installed
    if at.tzinfo is None:
        raise ValueError("a story's time must be timezone-aware")
    with _install_lock:
        if _installed == 0:
            setattr(django_timezone, _REPLACED, _StoryDatetime)
        _installed += 1
    token = _story_time.set(at)
    try:
        yield
    finally:
        _story_time.reset(token)
        with _install_lock:
            _installed -= 1
            if _installed == 0:
                setattr(django_timezone, _REPLACED, _real_datetime)
