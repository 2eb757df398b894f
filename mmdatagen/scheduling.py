"""The dispatch core: which request may start next, for every clock.

One strategy, three drivers. The core decides, for a slot asking at a time its driver reads from
its own clock, whether that slot sends a request now, waits for a paced arrival slot, waits at a
phase barrier, or stops. It owns no clock and never sleeps:

- ``loadgen/dispatch.py`` drives it with asyncio in real time (the loader's workers);
- ``sim/virtual.py`` drives it with a virtual-time event loop around the simulator's engine
  (``simulate``, ``sweep --virtual``);
- ``analysis/concurrency.py`` drives it with completion order only (first-in first-out or a
  seeded random request completes next: the analysis's in-flight model).

The rules (AIPerf's causal replay):

- **Slots**: ``concurrency`` slots each own one session at a time, so the limit counts sessions
  in flight. A session's next turn is sent by the same slot after the previous one completed (its
  ``delay`` is the driver's to wait); a finished session frees the slot for the next session, in
  the order of ``mmdatagen.sessions`` (the feed: the loader's lazy ``SessionSource`` or the
  in-memory ``sessions.Replay``).
- **Phases**: warmup, then profiling. A phase issues at most its ``count`` requests; the next
  phase opens when the previous one has drained (nothing in flight, no paced ticket held, and its
  count used up or the data exhausted with no session's turn left). Slots that asked meanwhile are held and released together, in
  slot order; a session continues across the barrier where it stopped.
- **Arrivals**: a paced phase (``arrivals.Pacer``) gives each request a ticket, the next slot of
  the arrival process taken at the time the slot asks; a ticket in the future makes the slot wait,
  and counts as issued. Without a pacer a free slot sends at once.
- **Stopping**: ``stop()`` (Ctrl-C, a fatal dataset row, the duration reached) ends every slot;
  a phase with a ``duration`` stops the run when a request would start past it.

Order of the checks when a slot asks: stopped, a held ticket (sent at once: the driver came back
at its time), the phase's count, the slot's next turn (a new session when the last one ended; none
left: the slot retires), the barrier, then the pacer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from .arrivals import Pacer

S = TypeVar("S")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
SEND, WAIT, HOLD, DONE = 0, 1, 2, 3
WARMUP, PROFILING = "warmup", "profiling"


class Feed(Protocol[S, T_co]):
    """Sessions in start order and each session's turns (``mmdatagen.sessions``' rule)."""

    def next_session(self) -> S | None: ...

    def next_turn(self, session: S) -> T_co | None: ...


@dataclass
class Phase:
    """One phase: a name, a request count (None: no limit), an optional pacer and duration (in
    the driver's time unit, from the moment the phase opens)."""

    name: str
    count: int | None = None
    pacer: Pacer | None = None
    duration: float | None = None
    issued: int = 0
    in_flight: int = 0
    tickets: int = 0
    started: float | None = None

    def used(self) -> bool:
        """The request count is used up."""
        return self.count is not None and self.issued >= self.count


@dataclass(eq=False)
class Slot(Generic[S, T]):
    """One worker of the core. After :meth:`Core.next` returned SEND, ``session``/``turn``/
    ``phase`` say what to send (``opens``: the turn starts its session); after WAIT, ``at`` says
    when to ask again."""

    index: int
    session: S | None = None
    turn: T | None = None
    phase: str = ""
    at: float = 0.0
    opens: bool = False
    ticket: bool = False
    retired: bool = False
    sent_in: Phase | None = None  # the phase of the request in flight


@dataclass
class Core(Generic[S, T]):
    """The strategy: sessions from ``feed``, ``phases`` in order, one :class:`Slot` per worker."""

    feed: Feed[S, T]
    phases: list[Phase]
    slots: list[Slot[S, T]] = field(default_factory=list)
    current: int = 0
    stopped: bool = False
    exhausted: bool = False
    held: list[Slot[S, T]] = field(default_factory=list)
    released: list[Slot[S, T]] = field(default_factory=list)  # the driver takes them

    def __post_init__(self) -> None:
        self.phases = [p for p in self.phases if p.count != 0] or [Phase(PROFILING, 0)]

    @property
    def phase(self) -> Phase:
        return self.phases[self.current]

    def add_slot(self) -> Slot[S, T]:
        slot: Slot[S, T] = Slot(len(self.slots))
        self.slots.append(slot)
        return slot

    def stop(self) -> None:
        """No request starts from now on."""
        self.stopped = True

    def next(self, slot: Slot[S, T], now: float) -> int:
        """What ``slot`` does at ``now``: SEND, WAIT (until ``slot.at``), HOLD (until the phase
        barrier releases it into ``released``) or DONE."""
        if self.stopped:
            return DONE
        ph = self.phases[self.current]
        if slot.ticket:  # the driver came back at the ticket's time
            slot.ticket = False
            ph.tickets -= 1
        else:
            step = self._admit(slot, ph, now)
            if step != SEND:
                return step
        if ph.duration is not None and ph.started is not None and now - ph.started >= ph.duration:
            self.stopped = True
            return DONE
        ph.in_flight += 1
        slot.phase, slot.sent_in = ph.name, ph
        return SEND

    def _admit(self, slot: Slot[S, T], ph: Phase, now: float) -> int:
        """A request of ``slot`` in phase ``ph``: the count, the slot's next turn, the pacer."""
        if ph.count is not None and ph.issued >= ph.count:
            if self.current + 1 < len(self.phases):
                self.held.append(slot)
                return HOLD
            return DONE
        if slot.turn is None and not self._open_session(slot):
            return DONE
        if ph.started is None:
            ph.started = now
        ph.issued += 1
        if ph.pacer is not None:
            at = ph.pacer.take(now)
            if at > now:
                slot.ticket, slot.at, slot.phase = True, at, ph.name
                ph.tickets += 1
                return WAIT
        return SEND

    def _open_session(self, slot: Slot[S, T]) -> bool:
        """Give ``slot`` the next session's first turn; False (the slot retires) when none."""
        session = None if self.exhausted else self.feed.next_session()
        turn = None if session is None else self.feed.next_turn(session)
        if turn is None:
            self.exhausted = True
            slot.retired = True
            self._drain(None)
            return False
        slot.session, slot.turn, slot.opens = session, turn, True
        return True

    def complete(self, slot: Slot[S, T], now: float) -> T | None:
        """The request ``slot`` sent has completed (or failed) at ``now``: the session's next
        turn (None: the session is over), whose ``delay`` the driver waits before asking again."""
        assert slot.sent_in is not None, "complete() follows a SEND"
        slot.sent_in.in_flight -= 1
        slot.sent_in, slot.opens = None, False
        turn = None if slot.session is None else self.feed.next_turn(slot.session)
        slot.turn = turn
        if turn is None:
            slot.session = None
        if self.current + 1 < len(self.phases):
            self._drain(now)
        return turn

    def _drain(self, now: float | None) -> None:
        """Open the next phase once the current one has drained; release the held slots."""
        while self.current + 1 < len(self.phases):
            ph = self.phases[self.current]
            if ph.in_flight or ph.tickets or not (ph.used() or self._dry()):
                return
            self.current += 1
            self.phases[self.current].started = now
            held, self.held = sorted(self.held, key=lambda s: s.index), []
            self.released.extend(held)

    def _dry(self) -> bool:
        """The data is exhausted and no slot holds a session's next turn."""
        return self.exhausted and all(s.turn is None for s in self.slots)

    def finished(self) -> bool:
        """Nothing in flight, no ticket held, and no slot can send again."""
        if self.stopped:
            return not any(p.in_flight for p in self.phases)
        ph = self.phases[self.current]
        if ph.in_flight or ph.tickets or self.held:
            return False
        return (ph.used() or all(s.retired for s in self.slots)) and \
            self.current + 1 >= len(self.phases)

    def may_issue(self) -> bool:
        """A request may still start in the current phase (count left or a ticket held)."""
        ph = self.phases[self.current]
        return not self.stopped and (not ph.used() or ph.tickets > 0)


#: slots of a paced run without a concurrency: sessions in flight are capped, not unlimited
RATE_DEFAULT_CAP = 1024


def slots_for(concurrency: int | None, request_rate: float | None) -> int:
    """The slots of a run, for every driver: its concurrency, else 1 (closed loop, one session
    at a time) or, paced by a request rate, :data:`RATE_DEFAULT_CAP`."""
    if concurrency is not None:
        return concurrency
    return RATE_DEFAULT_CAP if request_rate else 1


def phases(warmup: int, count: int | None, pacer: Pacer | None = None,
           duration: float | None = None) -> list[Phase]:
    """The run's phases: ``warmup`` requests unpaced, then ``count`` paced by ``pacer``."""
    return [Phase(WARMUP, warmup), Phase(PROFILING, count, pacer, duration)]
