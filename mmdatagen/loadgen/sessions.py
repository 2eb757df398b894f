"""Lazy session sources: which request goes next, read from the dataset as needed.

- ``single_turn``: rows sharing a ``session_id`` form one session in file order (even when
  interleaved); sessions start in order of first appearance; rows without one are 1-request
  sessions. Rows are read only as far as the next needed one, so memory stays flat for
  turn-major files and plain row streams.
- ``multi_turn``: one session per line, turns in order (the caller keeps history).
- ``random_pool``: rows sampled with replacement (seeded); the pool is held in memory.
"""
from __future__ import annotations

import itertools
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..errors import DatasetError
from ..io.readers import Turn


@dataclass
class Session:
    """One conversation: its id, a stable correlation id, and rows read but not yet sent."""

    conversation_id: str
    correlation_id: str
    pending: deque = field(default_factory=deque)
    complete: bool = False
    sent: int = 0


class SessionSource:
    """Sessions and their next turns, read lazily from ``open_turns()`` (re-opened to wrap)."""

    def __init__(self, open_turns: Callable[[], Iterator[Turn]], fmt: str, *,
                 wrap: bool = False, seed: int = 0) -> None:
        self.open_turns = open_turns
        self.fmt = fmt
        self.wrap = wrap
        self.passes = 0
        self.rows_read = 0
        self._it: Iterator[Turn] | None = None
        self._eof = False
        self._open: dict[str, Session] = {}
        self._new: deque[Session] = deque()
        self._last_multi: Session | None = None
        self._anon = itertools.count()
        self._pool: list[Turn] | None = None
        self._rng = np.random.default_rng(seed)
        if fmt == "random_pool":
            self._pool = list(open_turns())
            if not self._pool:
                raise DatasetError("the random_pool dataset has no rows")

    # -- reading -------------------------------------------------------------------------
    def _start_pass(self) -> None:
        self.passes += 1
        self._it = self.open_turns()
        self._eof = False
        self._open.clear()
        self._last_multi = None

    def _read_one(self) -> bool:
        """Read one row into its session; False at end of file."""
        if self._it is None:
            self._start_pass()
        if self._eof:
            return False
        assert self._it is not None  # opened by _start_pass
        turn = next(self._it, None)
        if turn is None:
            self._eof = True
            for s in self._open.values():
                s.complete = True
            if self._last_multi is not None:
                self._last_multi.complete = True
            self._open.clear()
            return False
        self.rows_read += 1
        suffix = "" if self.passes <= 1 else f"#{self.passes}"
        if self.fmt == "multi_turn":
            key = f"{turn.line_no}"
            last = self._last_multi
            if last is not None and last.correlation_id.endswith(f":{key}"):
                last.pending.append(turn)
                return True
            if last is not None:
                last.complete = True
            sess = Session(f"{turn.session_id}{suffix}", f"{uuid.uuid4()}:{key}")
            sess.pending.append(turn)
            self._last_multi = sess
            self._new.append(sess)
            return True
        if turn.session_id is None:
            sess = Session(f"row_{turn.line_no}{suffix}", str(uuid.uuid4()), complete=True)
            sess.pending.append(turn)
            self._new.append(sess)
            return True
        found = self._open.get(turn.session_id)
        if found is not None:
            sess = found
        else:
            sess = Session(f"{turn.session_id}{suffix}", str(uuid.uuid4()))
            self._open[turn.session_id] = sess
            self._new.append(sess)
        sess.pending.append(turn)
        return True

    # -- API -----------------------------------------------------------------------------
    def next_session(self) -> Session | None:
        """The next session to start (first appearance order); None when the data ran out."""
        if self._pool is not None:
            i = int(self._rng.integers(len(self._pool)))
            turn = self._pool[i]
            sess = Session(f"pool_{next(self._anon)}", str(uuid.uuid4()), complete=True)
            sess.pending.append(turn)
            return sess
        while not self._new:
            if not self._read_one():
                if not self.wrap:
                    return None
                if self.rows_read == 0:
                    raise DatasetError("the dataset has no rows")
                rows_before = self.rows_read
                self._start_pass()
                if not self._read_one() and self.rows_read == rows_before:
                    return None
        return self._new.popleft()

    def next_turn(self, sess: Session) -> Turn | None:
        """The session's next row (reading ahead as needed); None when the session is over."""
        while not sess.pending:
            if sess.complete or not self._read_one():
                return None
        sess.sent += 1
        return sess.pending.popleft()
