"""What one upstream JSON-RPC message may become once parsed, checked on its raw text before the SDK
parses it (docs/security.md, "Bounds").

The ``mcp`` SDK builds a whole message as Python objects, about 220 bytes per JSON value (an empty
list in ``_meta``: 3 bytes on the wire): a byte cap alone does not bound memory. So each message has
a ``Budget``: bytes, JSON values (object keys included) and nesting depth, chosen by the method of
the request it answers (``budget_for``).

Contract:
- ``ShapeScanner`` counts one message's values and depth as its text arrives, chunk by chunk, in
  O(1) memory (a few integers and flags; no object is built, no text kept) and linear time. It
  raises ``ShapeError`` (a ``ValueError``) with a one-line reason as soon as the message passes its
  budget's values or depth; it judges shape, not validity (malformed JSON is the parser's to refuse).
- ``SseShape`` does the same for a ``text/event-stream`` body: each event's ``data:`` lines are one
  message (its bytes, values and depth), counted as they arrive.
- Every reason names "byte limit", which ``classify_error`` (activities/mcp_session.py) makes a
  MALFORMED read: final for that read, never retried, and the session stays up.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import NamedTuple

__all__ = ["Budget", "MAX_DEPTH", "OTHER_BYTES", "OTHER_VALUES", "PAGE_BYTES", "PAGE_VALUES", "READ_VALUES",
           "ShapeError", "ShapeScanner", "SseShape", "budget_for", "ceiling", "over_bytes"]

MAX_DEPTH = 64
"""Nesting depth of any message: the envelope, a result, its contents and their ``_meta`` take
fewer than ten levels; deep nesting only costs the parser (and its recursion)."""
READ_VALUES = 100_000
"""Values in one ``resources/read`` result (about 22 MB parsed at worst): a read is a few contents,
each a handful of values; its one large value, the text or blob, is bounded by its bytes."""
PAGE_BYTES = 16 * 1024 * 1024
"""Bytes of one ``resources/list`` or ``resources/templates/list`` page: 100,000 descriptors
(``MAX_MESSAGE_URIS``) of about 160 bytes each."""
PAGE_VALUES = 1_000_000
"""Values in one list page: ten per descriptor at ``MAX_MESSAGE_URIS`` descriptors (a descriptor is
an object, its keys and values: ``uri``, ``name``, ``mimeType``, ``title``, ``description``)."""
OTHER_BYTES = 1024 * 1024
"""Bytes of any other message (initialize, subscribe and ping replies, notifications, requests from
the server): the SDK's own cap on one SSE event."""
OTHER_VALUES = 100_000
"""Values in any other message."""
_PAGE_METHODS = frozenset({"resources/list", "resources/templates/list"})


class Budget(NamedTuple):
    """What one message may take: ``bytes`` on the wire, ``values`` and ``depth`` parsed."""

    bytes: int
    values: int
    depth: int
    source: str  # where the bytes limit comes from, for the reason


def budget_for(method: str | None, read_bytes: int) -> Budget:
    """The budget of a message answering ``method`` (None: a notification, a request from the
    server, or an answer to a request we no longer know) when a read may take ``read_bytes``."""
    if method == "resources/read":
        return Budget(read_bytes, READ_VALUES, MAX_DEPTH, "max_content_bytes")
    if method in _PAGE_METHODS:
        return Budget(PAGE_BYTES, PAGE_VALUES, MAX_DEPTH, "list page")
    return Budget(OTHER_BYTES, OTHER_VALUES, MAX_DEPTH, "message")


def ceiling(read_bytes: int) -> Budget:
    """The largest budget of any method: what a message may take before its method is known."""
    budgets = [budget_for(m, read_bytes) for m in ("resources/read", "resources/list", None)]
    return Budget(max(b.bytes for b in budgets), max(b.values for b in budgets), MAX_DEPTH, "any method")


def over_bytes(budget: Budget) -> str:
    return f"response over the byte limit of {budget.bytes} bytes ({budget.source})"


class ShapeError(ValueError):
    """A message passed its budget; the message is the reason."""


_STR = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.S)  # a string's body up to its closing quote
# Between tokens: whitespace, then a structural character or a run of scalar characters.
_TOKEN = re.compile(r'[ \t\r\n]*(?:(["\[\]{},:])|([^ \t\r\n"\[\]{},:]+))')
_SCALAR = re.compile(r'[^ \t\r\n"\[\]{},:]*')
_EOL = re.compile(rb"[\r\n]")
_OPEN, _CLOSE = frozenset('[{'), frozenset(']}')


class ShapeScanner:
    """Counts one JSON message's values and depth as its text (``str`` or ``bytes``) arrives."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.values = self.depth = 0
        self.in_string = self.escaped = self.in_scalar = False

    def feed(self, chunk: str | bytes) -> None:
        """Count ``chunk``, the message's next text; ``ShapeError`` once it passes the budget."""
        # Bytes as Latin-1: one byte, one character; every token is ASCII, so UTF-8 counts alike.
        text = chunk.decode("latin-1") if isinstance(chunk, bytes) else chunk
        string_body, token, scalar = _STR, _TOKEN, _SCALAR
        i, n = 0, len(text)
        if self.in_scalar:
            i = scalar.match(text).end()  # type: ignore[union-attr]  # the scalar the last chunk ended in
            self.in_scalar = i == n
        while i < n:
            if self.in_string:
                if self.escaped:
                    i, self.escaped = i + 1, False
                    continue
                quote = text.find('"', i)
                stop = n if quote < 0 else quote
                if text.find("\\", i, stop) < 0:  # no escape before it: find is much faster than re
                    i = stop
                else:
                    i = string_body.match(text, i).end()  # type: ignore[union-attr]
                if i < n:  # a closing quote, or a backslash that ends the chunk
                    self.in_string, self.escaped = text[i] != '"', text[i] == "\\"
                    i += 1
                continue
            found = token.match(text, i)
            if found is None:  # whitespace to the end
                break
            i = found.end()
            c = found.group(1)
            if c is None:  # a number, true, false, null (or garbage: the parser's to refuse)
                self._count()
                self.in_scalar = i == n
            elif c == '"':
                self._count()
                self.in_string = True
            elif c in _OPEN:
                self._count()
                self.depth += 1
                if self.depth > self.budget.depth:
                    raise ShapeError(f"response over the byte limit's structure bound: nested deeper than "
                                     f"{self.budget.depth} levels")
            elif c in _CLOSE:
                self.depth = max(self.depth - 1, 0)  # one close too many is the parser's to refuse

    def _count(self) -> None:
        self.values += 1
        if self.values > self.budget.values:
            raise ShapeError(self._too_many())

    def _too_many(self) -> str:
        return (f"response over the byte limit's structure bound: more than {self.budget.values} JSON values "
                f"({self.budget.source})")

    def check(self, budget: Budget) -> None:
        """``ShapeError`` if what was counted so far is over ``budget`` (a message whose method is
        known only at its end: a TypeScript server puts ``id`` last); later chunks count against it."""
        self.budget = budget
        if self.values > budget.values:
            raise ShapeError(self._too_many())


class SseShape:
    """Counts each event of a ``text/event-stream`` body: its ``data:`` lines, joined, are one
    message within ``budget``. O(1) memory: at most five bytes of a line's field name."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.scanner = ShapeScanner(budget)
        self.size = 0  # data bytes of the current event
        self.field = b""  # the current line's first bytes, until it is known whether it is a data line
        self.state = _Line.FIELD
        self.after_cr = False

    def feed(self, chunk: bytes) -> None:
        """Count ``chunk``, the body's next bytes; ``ShapeError`` once an event passes the budget."""
        i, n = 0, len(chunk)
        while i < n:
            if self.after_cr:  # \r\n is one line end
                self.after_cr = False
                if chunk[i] == 0x0A:
                    i += 1
                    continue
            end = _line_end(chunk, i)
            self._piece(chunk[i:end])
            if end == n:
                break
            self._line_ended()
            self.after_cr = chunk[end] == 0x0D
            i = end + 1

    def _piece(self, piece: bytes) -> None:
        while piece:
            if self.state == _Line.FIELD:
                take = 5 - len(self.field)
                self.field, piece = self.field + piece[:take], piece[take:]
                if self.field != b"data:"[:len(self.field)]:
                    self.state = _Line.OTHER
                elif len(self.field) == 5:
                    self.state = _Line.DATA_SPACE
            elif self.state == _Line.DATA_SPACE:
                if piece[:1] == b" ":
                    piece = piece[1:]
                self.state = _Line.DATA
            elif self.state == _Line.DATA:
                self._data(piece)
                return
            else:
                return

    def _line_ended(self) -> None:
        if self.state == _Line.FIELD and not self.field:  # an empty line: the event ends
            self.scanner, self.size = ShapeScanner(self.budget), 0
        elif self.state in (_Line.DATA_SPACE, _Line.DATA):
            self._data(b"\n")  # data lines join with a newline: whitespace to JSON
        self.state, self.field = _Line.FIELD, b""

    def _data(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.size > self.budget.bytes:
            raise ShapeError(over_bytes(self.budget))
        self.scanner.feed(piece)


class _Line(Enum):
    """Where an SSE line is: its field name, the optional space after ``data:``, data, another field."""

    FIELD = 1
    DATA_SPACE = 2
    DATA = 3
    OTHER = 4


def _line_end(chunk: bytes, start: int) -> int:
    """Index of the first \\r or \\n at or after ``start``, or ``len(chunk)``."""
    found = _EOL.search(chunk, start)
    return found.start() if found else len(chunk)
