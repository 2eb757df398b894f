"""Lazy session sources: which request goes next, read from the dataset as needed.

- ``single_turn`` and ``multi_turn``: sessions, their start order, turn order and wrap labels
  follow ``mmdatagen.sessions`` (the rule ``simulate`` and the analysis use). Rows are read only
  as far as the next needed one, so memory stays flat for turn-major files, plain row streams
  and multi_turn files; the caller keeps a multi_turn session's history.
- ``random_pool``: rows sampled with replacement (seeded); the pool is held in memory.
"""
from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..errors import DatasetError
from ..io.readers import Turn
from ..sessions import SessionIndex, epoch_label, row_key, row_label, shard_owns


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
                 wrap: bool = False, seed: int = 0, shard: tuple[int, int] = (0, 1)) -> None:
        self.open_turns = open_turns
        self.fmt = fmt
        self.wrap = wrap
        self.shard = shard  # (this worker, workers): only its sessions are read into sessions
        self._mine = 0  # this worker's sessions in the current pass
        self._draws = 0  # random_pool draws so far, every worker's
        self.passes = 0
        self.rows_read = 0
        self._it: Iterator[Turn] | None = None
        self._eof = False
        self.multi = fmt == "multi_turn"
        self._index = SessionIndex()
        self._open: dict[int, Session] = {}  # sessions of this pass that may still get rows
        self._new: deque[Session] = deque()
        self._pool: list[Turn] | None = None
        self._rng = np.random.default_rng(seed)
        if fmt == "random_pool":
            self._pool = list(open_turns())
            if not self._pool:
                raise DatasetError("the random_pool dataset has no rows")

    # -- reading -------------------------------------------------------------------------
    def _start_pass(self) -> None:
        if self.passes and not self._mine:
            raise DatasetError(f"load worker {self.shard[0]} of {self.shard[1]} has no session "
                               "to send: the dataset has fewer sessions than workers")
        self._mine = 0
        self.passes += 1
        self._it = self.open_turns()
        self._eof = False
        self._open.clear()
        self._index.reset()

    def _read_one(self) -> bool:
        """Read one row into its session (the rule of ``mmdatagen.sessions``); False at end of
        file."""
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
            self._open.clear()
            return False
        self.rows_read += 1
        number, new = self._index.add(row_key(turn.session_id, turn.line_no, self.multi))
        mine = shard_owns(number, *self.shard)
        if not new:
            if mine:
                self._open[number].pending.append(turn)
            return True
        if self.multi:  # a multi_turn line's session is over when the next line starts
            for s in self._open.values():
                s.complete = True
            self._open.clear()
        if not mine:
            return True
        self._mine += 1
        alone = not self.multi and turn.session_id is None  # a one-row session
        sess = Session(epoch_label(row_label(turn.session_id, turn.line_no), self.passes - 1),
                       str(uuid.uuid4()), complete=alone)
        sess.pending.append(turn)
        if not alone:
            self._open[number] = sess
        self._new.append(sess)
        return True

    # -- API -----------------------------------------------------------------------------
    def next_session(self) -> Session | None:
        """The next session to start (first appearance order); None when the data ran out."""
        if self._pool is not None:  # every worker draws the one stream and keeps its share
            while True:
                draw = self._draws
                self._draws += 1
                i = int(self._rng.integers(len(self._pool)))
                if shard_owns(draw, *self.shard):
                    break
            turn = self._pool[i]
            sess = Session(f"pool_{draw}", str(uuid.uuid4()), complete=True)
            sess.pending.append(turn)
            return sess
        while not self._new:
            if not self._read_one():
                if not self.wrap:
                    if not self._mine and self.shard[1] > 1:
                        raise DatasetError(f"load worker {self.shard[0]} of {self.shard[1]} has "
                                           "no session to send: the dataset has fewer sessions "
                                           "than workers")
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
