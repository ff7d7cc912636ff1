"""How a Python traceback was printed: whether the code that raised went on after it.

Python prints a traceback in a few situations, and each leaves a mark in the lines around it:

* **top level**: the exception reached the module's own code. Either nothing caught it and
  ``sys.excepthook`` prints it as the interpreter ends, or a handler at the top of the script
  logs it on the way out; either way the program is ending. The traceback's outermost frame is
  the module (``File "train.py", line 214, in <module>``) or runpy's entry for ``python -m``.
* **thread died**: an exception nothing caught in a thread. ``threading`` prints
  "Exception in thread NAME:" before it, and the outermost frame is its ``_bootstrap_inner``.
  The thread is gone; the process goes on, and whoever waited for that thread may wait for ever.
* **child died**: the same in a ``multiprocessing`` child: "Process NAME:" and its
  ``_bootstrap``.
* **handled**: a handler caught it and printed it (``logging.exception``,
  ``traceback.print_exc``) and the program went on. A traceback starts at the frame that caught
  the exception, so its outermost frame is an ordinary function, and a logging record's header
  (``ERROR:train.data:skipping sample ...``) often comes just before it.

What comes next is the program's to show; this only says how the lines were printed, so that
silence after a handled error is judged as any silence (by the hang rules), and silence after
a thread's death or the end of the top level as the stall it probably is. The lines are what a
user's program printed: they may delay an action on that program's own job, never cause one.
"""

from __future__ import annotations

from enum import StrEnum

from recovery.detection.linear_regex import compile_linear


class Printed(StrEnum):
    """How a traceback was printed; ``UNKNOWN`` when the lines around it were not read."""

    TOP_LEVEL = "top_level"
    THREAD_DIED = "thread_died"
    CHILD_DIED = "child_died"
    HANDLED = "handled"
    UNKNOWN = ""


# Which of several tracebacks of one finding speaks for it: the one that says least that the
# program went on.
PRECEDENCE = (
    Printed.TOP_LEVEL,
    Printed.THREAD_DIED,
    Printed.CHILD_DIED,
    Printed.UNKNOWN,
    Printed.HANDLED,
)

TRACEBACK_HEADER = "Traceback (most recent call last):"
# How far from its header a traceback's first frame and the line before it are looked for:
# other ranks' lines may come between.
NEIGHBOUR_LINES = 16
# How many lines after its header a traceback's exception line may come (deep stacks, chained
# exceptions, other ranks in between).
TRACEBACK_REACH = 600

_FRAME = compile_linear(r'^File "([^"]+)", line \d{1,9}, in (\S+)')
_THREAD_BANNER = compile_linear(r"^Exception in thread \S")
_CHILD_BANNER = compile_linear(r"^Process [A-Za-z0-9_.:-]{1,128}:$")
# A logging record's header: the level as the first word ("ERROR:name:msg", "ERROR - msg",
# "[ERROR] msg") or as a field of a formatted record ("2024-05-01 12:00:00,123 - train - ERROR -
# msg", "12:00:00 | ERROR | msg", "[2024-05-01 12:00:00][train][ERROR] - msg").
_LOG_RECORD = compile_linear(
    r"^\[?(?:ERROR|WARNING|WARN|CRITICAL|FATAL|EXCEPTION)\b"
    r"|^.{0,120}?(?:\s-\s|\s\|\s|\]\[|\]\s)\[?(?:ERROR|WARNING|WARN|CRITICAL|FATAL|EXCEPTION)"
    r"(?:\]|\s*-\s|\s*\||:\s)"
)


CHAIN_MARKERS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


def continues_chain(line_before: str | None) -> bool:
    """Whether the traceback after ``line_before`` is the next of a chain of exceptions: the
    last one printed is the one that propagated, and decides for the whole chain."""
    return line_before is not None and line_before.startswith(CHAIN_MARKERS)


def is_header(message: str) -> bool:
    """A traceback's own header; a DataLoader's "Original Traceback" inside an exception's
    message is part of the traceback it ends."""
    return message.startswith(TRACEBACK_HEADER)


def printed_as(line_before: str | None, first_frame: str | None) -> Printed:
    """How a traceback was printed, from the message before its header and its first frame.

    Either may be None when it was not read (another read, a line cut short).
    """
    frame = _FRAME.search(first_frame) if first_frame is not None else None
    if frame is not None:
        path, function = frame.group(1), frame.group(2)
        if function == "<module>" or (
            path.endswith("runpy.py") and function in ("_run_module_as_main", "_run_code")
        ):
            return Printed.TOP_LEVEL
        if path.endswith("threading.py") and function in ("_bootstrap_inner", "_bootstrap"):
            return Printed.THREAD_DIED
        if path.endswith("process.py") and function == "_bootstrap" and "multiprocessing" in path:
            return Printed.CHILD_DIED
    if line_before is not None:
        if _THREAD_BANNER.search(line_before):
            return Printed.THREAD_DIED
        if _CHILD_BANNER.search(line_before):
            return Printed.CHILD_DIED
        if _LOG_RECORD.search(line_before[:200]):
            return Printed.HANDLED
    # Caught by the function its outermost frame names, and printed: no banner, no module.
    return Printed.HANDLED if frame is not None else Printed.UNKNOWN


def least_handled(kinds: set[Printed]) -> Printed:
    """Of several tracebacks behind one finding, the printing that says least that it went on."""
    return next((kind for kind in PRECEDENCE if kind in kinds), Printed.UNKNOWN)
