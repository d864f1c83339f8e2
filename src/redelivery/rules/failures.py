"""What a failed delivery records (issue 40): the error's class, its message, the top frame of the
consumer's own code and a bounded stack. Pure functions, no I/O.

The signature, the id of "the same failure", is computed by PostgreSQL from the class, the message
and the frame (``error_signature``, migration 0020: numbers, ids, UUIDs, hex and quoted values of
the message normalised, then hashed), so that a failure recorded by Python, by a Spark task, by a
tier run or by a migration's backfill gets it from one definition. What no consumer raises has a
class of its own: ``LEASE_EXPIRED_CLASS``, ``UNDECODABLE_CLASS``.

The peers keep the same parts: Spring Kafka's dead-letter headers (exception class, message,
stack trace), River's ``{at, attempt, error, trace}`` per attempt.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import TracebackType

#: The frames a stack keeps (the innermost ones) and its size at most, in characters.
STACK_FRAMES, STACK_CHARS = 8, 4000
#: The classes of the failures redelivery itself records.
LEASE_EXPIRED_CLASS = "redelivery.LeaseExpired"
UNDECODABLE_CLASS = "redelivery.UndecodableBody"

#: Where code that is not the consumer's lives: the standard library, installed packages and
#: redelivery itself. The top frame is the innermost frame outside them.
_PATHS = sysconfig.get_paths()
_NOT_OWN = tuple(
    str(path) + os.sep  # a directory and what is under it, not a sibling that starts alike
    for path in {
        Path(_PATHS[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in _PATHS
    }
    | {Path(__file__).resolve().parent.parent}  # the redelivery package
)


@dataclass(frozen=True)
class Failure:
    """One failed delivery's error: ``error`` the text shown and searched (for an exception
    ``"<class name>: <message>"``, as Python prints its last line), ``error_class`` the exception's
    qualified class (``module.QualName``; a builtin's bare name), ``frame`` the top frame of the
    consumer's code (``module:function``, no line number: an edit above it changes no signature),
    ``stack`` the innermost ``STACK_FRAMES`` frames, at most ``STACK_CHARS`` characters. A text
    given as the error has only ``error``."""

    error: str | None
    error_class: str | None = None
    frame: str | None = None
    stack: str | None = None

    def as_json(self) -> dict:
        """The object a statement reads (``errors``: ``{"error", "class", "frame", "stack"}``)."""
        return {"error": self.error, "class": self.error_class, "frame": self.frame, "stack": self.stack}


def describe(error: str | BaseException | Failure | None) -> Failure | None:
    """The ``Failure`` of an error as a consumer gives it: a text (``Failure(text)``), an exception
    (its class, message, top frame and stack), a ``Failure`` (its stack cut to ``STACK_CHARS``) or
    None (no error: None). Raises ``ValueError`` for a text PostgreSQL cannot store (a NUL
    character, a lone surrogate) or anything else; an exception's own texts have those written as
    escapes, and a ``__str__`` that raises is named as such (the consumer cannot change what a
    library raised, and its failure must still be recorded)."""
    if error is None:
        return None
    if isinstance(error, BaseException):
        return _of_exception(error)
    if isinstance(error, Failure):  # its parts given one by one (a Spark settle's columns)
        for part in (error.error, error.error_class, error.frame, error.stack):
            _check_text(part)
        stack = error.stack[-STACK_CHARS:] if error.stack else None
        return Failure(error.error, error.error_class, error.frame, stack)
    return Failure(_check_text(error))


def _check_text(text: object) -> str | None:
    if text is not None and (not isinstance(text, str) or "\x00" in text or not _is_utf8(text)):
        raise ValueError(
            "an error must be an exception, or a str without a NUL character or a lone surrogate "
            f"(PostgreSQL cannot store them), got {type(text).__name__} {repr(text)[:40]}"
        )
    return text


def _of_exception(exc: BaseException) -> Failure:
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001  (a broken __str__ must not lose the failure; traceback's words)
        message = "<exception str() failed>"
    text = f"{kind.__qualname__}: {message}" if message else kind.__qualname__
    frames = _frames(exc.__traceback__)
    kept = [  # the source lines of the kept frames only (a deep traceback costs its last frames)
        traceback.FrameSummary(path, line, function, lookup_line=True)
        for path, line, function, _ in frames[-STACK_FRAMES:]
    ]
    stack = "".join(traceback.format_list(kept))
    return Failure(
        error=_storable(text),
        error_class=_storable(name),
        frame=_storable(_top_frame(frames)),
        stack=_storable(stack[-STACK_CHARS:]) if stack else None,
    )


def _storable(text: str | None) -> str | None:
    """``text`` as PostgreSQL and JSON can hold it: a NUL and a lone surrogate (a path or bytes
    decoded with surrogateescape) written as escapes."""
    if text is None:
        return None
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _frames(tb: TracebackType | None) -> list[tuple[str, int, str, str]]:
    """Each frame of ``tb``, outermost first: (file, line, function, ``module:function``)."""
    found = []
    while tb is not None:
        code = tb.tb_frame.f_code
        module = tb.tb_frame.f_globals.get("__name__", "?")
        found.append((code.co_filename, tb.tb_lineno, code.co_name, f"{module}:{code.co_qualname}"))
        tb = tb.tb_next
    return found


def _top_frame(frames: list[tuple[str, int, str, str]]) -> str | None:
    """The innermost frame of the consumer's own code (not the standard library's, an installed
    package's or redelivery's), else the innermost frame; None without a traceback."""
    for path, _, _, name in reversed(frames):
        if _is_own(path):
            return name
    return frames[-1][3] if frames else None


@lru_cache(maxsize=4096)
def _is_own(path: str) -> bool:
    """Whether a frame's file is the consumer's (resolved once per file: a batch of failures
    walks the same files)."""
    return not path.startswith("<") and not (str(Path(path).resolve()) + os.sep).startswith(_NOT_OWN)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
