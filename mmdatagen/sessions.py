"""Session order: the one rule of the loader (real time), ``simulate`` (virtual time) and the
analysis's causal concurrency model (AIPerf's session replay).

- **Which rows form a session**: ``single_turn`` rows sharing a ``session_id`` form one session,
  even when interleaved with others; a row without one is a session of its own. A
  ``multi_turn`` line is one session (its turns), whatever its ``session_id``.
- **Which session starts next**: sessions start in order of first appearance in the file.
- **Turn order**: a session's turns keep file order.
- **Wrapping**: a run that needs more sessions than one pass holds starts the sequence again;
  the sessions of pass ``p`` (0-based) are labelled ``label#p`` (pass 0 keeps ``label``).
- **Sharding**: load worker ``k`` of ``n`` sends the sessions numbered ``k, k+n, ...``
  (:func:`shard_owns`).

:class:`SessionIndex` applies the rule to rows as they arrive (the loader reads lazily);
:func:`group_rows` applies it to a whole column (:func:`group_ids`: the same for a numpy column
of integer ids, vectorised); :class:`Cycle` hands out sessions pass after pass and
:class:`Replay` is the feed of the dispatch core (``mmdatagen.scheduling``) for sessions held in
memory (``simulate``, the analysis); the loader's lazy feed is ``loadgen.sessions.SessionSource``.
The consumers only ask them, so they cannot disagree (``tests/test_sessions.py``).
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


def row_key(session_id: str | None, line_no: int, multi_turn: bool = False) -> Hashable:
    """The grouping key of a row: its ``session_id``, or its line (a tuple, so it never equals an
    id) for a row without one and for every turn of a ``multi_turn`` line."""
    if multi_turn or session_id is None:
        return (line_no,)
    return session_id


def row_label(session_id: str | None, line_no: int) -> str:
    """A session's name in records and exports: its id, else ``row_<line>``."""
    return session_id if session_id is not None else f"row_{line_no}"


def shard_owns(number: int, index: int, count: int) -> bool:
    """Whether load worker ``index`` of ``count`` sends session ``number`` (first-appearance
    order within a pass): sessions are dealt round-robin, never split, so the workers together
    send every session once per pass, each in its file order."""
    return number % count == index


def epoch_label(label: str, epoch: int) -> str:
    """A session's name in pass ``epoch`` (0-based) of a wrapped run."""
    return label if epoch == 0 else f"{label}#{epoch}"


class SessionIndex:
    """Numbers sessions by first appearance as rows arrive in file order.

    Line keys (``(line_no,)``: rows without a ``session_id``, ``multi_turn`` lines) are held only
    while their line lasts (a line's turns arrive together), so memory stays flat for plain row
    streams and multi_turn files; session ids are held until :meth:`reset` (the end of a pass).
    """

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}
        self._line: tuple[Hashable, int] | None = None
        self.count = 0

    def add(self, key: Hashable) -> tuple[int, bool]:
        """The session of a row with ``key``, and whether the row starts it."""
        if isinstance(key, tuple):
            if self._line is not None and self._line[0] == key:
                return self._line[1], False
            self._line = (key, self.count)
        else:
            found = self._ids.get(key)
            if found is not None:
                return found, False
            self._ids[key] = self.count
        self.count += 1
        return self.count - 1, True

    def reset(self) -> None:
        """Start a new pass: every key is forgotten."""
        self._ids.clear()
        self._line = None
        self.count = 0


def group_rows(keys: Iterable[Hashable]) -> list[list[int]]:
    """Row indices per session (keys from :func:`row_key`, or any hashables), sessions in
    order of first appearance, rows in file order."""
    index = SessionIndex()
    groups: list[list[int]] = []
    for row, key in enumerate(keys):
        session, new = index.add(key)
        if new:
            groups.append([])
        groups[session].append(row)
    return groups


def group_ids(ids: np.ndarray) -> list[np.ndarray]:
    """:func:`group_rows` for a 1-D integer column (every id a session id), vectorised: the
    analysis's traces hold millions of rows."""
    ids = np.asarray(ids).reshape(-1)
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    rows = np.argsort(inverse, kind="stable")  # rows of each id, file order kept
    bounds = np.cumsum(np.bincount(inverse, minlength=first.size))
    split = np.split(rows, bounds[:-1])
    return [split[i] for i in np.argsort(first)]  # ids by first appearance


class Cycle:
    """Sessions ``0..count-1`` in order, pass after pass (``wrap``) or once."""

    def __init__(self, count: int, wrap: bool = True) -> None:
        self.count, self.wrap = count, wrap
        self.next = 0
        self.epoch = 0

    def take(self) -> tuple[int, int] | None:
        """(session, epoch) of the next session to start; None once a single pass is used up
        and ``wrap`` is off (or there is no session)."""
        if self.count == 0 or (self.epoch > 0 and not self.wrap):
            return None
        session, epoch = self.next, self.epoch
        self.next += 1
        if self.next == self.count:
            self.next, self.epoch = 0, self.epoch + 1
        return session, epoch


class Replayed(Generic[T]):
    """One session of a :class:`Replay`: its rows, its pass (``epoch``) and the next row."""

    __slots__ = ("epoch", "pos", "rows")

    def __init__(self, rows: Sequence[T], epoch: int) -> None:
        self.rows, self.epoch, self.pos = rows, epoch, 0


class Replay(Generic[T]):
    """Sessions held in memory (rows grouped by the rule), started in order, pass after pass
    (``wrap``) or once: a feed of the dispatch core (``next_session`` / ``next_turn``)."""

    def __init__(self, groups: Sequence[Sequence[T]], wrap: bool = True) -> None:
        self.groups = groups
        self.cycle = Cycle(len(groups), wrap)

    def next_session(self) -> Replayed[T] | None:
        nxt = self.cycle.take()
        return None if nxt is None else Replayed(self.groups[nxt[0]], nxt[1])

    def next_turn(self, session: Replayed[T]) -> T | None:
        if session.pos >= len(session.rows):
            return None
        session.pos += 1
        return session.rows[session.pos - 1]
