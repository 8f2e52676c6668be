"""Paces a model's requests to its provider's rate limits (requests and tokens per minute) for every attempt that shares them.

Concurrency alone does not keep a provider under its limits: a few fast attempts can burst past rpm/tpm and
earn 429s, whose backoff then differs between the arms that happen to run at that moment. Pacing before the
request keeps the load even; the time waited is charged like backoff (never to an attempt's working time).

One reservation book (`PaceBook`) holds the rule: a sliding window over requests and provider-counted tokens in
which each request reserves the earliest slot at which it fits, in arrival order, so no arm's request can be
overtaken indefinitely. The book never sleeps; the caller sleeps until its slot. The local executor keeps a book per
(model, api_base) in the process (`RateLimiter`); the Ray executor keeps one for the whole cluster in a named actor
(`mkb.experiment._ray_pace`) so that the sum over worker processes stays under the provider's limits. The agent asks
`limiter_for` and does not know which of the two it got.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol


class PacingUnavailable(RuntimeError):
    """The shared limiter cannot be reached (its actor died, or Ray is gone): sending unpaced would break the limits."""


@dataclass(frozen=True)
class Reservation:
    """A request's slot in a book: `t` is when it may be sent (the book's clock); `id` settles its token count."""

    id: int
    t: float


@dataclass
class _Entry:
    id: int
    t: float
    tokens: int


class PaceBook:
    """The reservation logic, without a clock or a lock: `reserve(now, tokens)` books the earliest slot that fits.

    A request fits at time s when the window (s - window_s, s] (entries with t + window_s > s) holds fewer than
    rpm requests and at most tpm tokens with it (an empty window admits one request however large, or it could
    never be sent). Slots are
    granted in arrival order (never before the latest one granted): a small request does not overtake a large
    one, so the wait is shared evenly among whoever is asking, whichever arm they run.
    """

    def __init__(self, *, rpm: int | None = None, tpm: int | None = None, window_s: float = 60.0) -> None:
        self.configure(rpm=rpm, tpm=tpm)
        if window_s <= 0:
            raise ValueError(f"the pacing window must be > 0 s (window_s={window_s})")
        self.window_s = window_s
        self._entries: list[_Entry] = []  # sorted by t (slots are granted in order)
        self._by_id: dict[int, _Entry] = {}
        self._tokens = 0  # sum over _entries: a reservation costs O(entries it passes), not O(window)
        self._next_id = 0

    def configure(self, *, rpm: int | None, tpm: int | None) -> None:
        """Set the limits (a driver restarted with new ones); the booked slots stay."""
        if rpm is not None and rpm < 1 or tpm is not None and tpm < 1:
            raise ValueError(f"rate limits must be >= 1 (rpm={rpm}, tpm={tpm})")
        self.rpm, self.tpm = rpm, tpm

    def _prune(self, now: float) -> None:
        k = 0
        while k < len(self._entries) and self._entries[k].t + self.window_s <= now:
            self._by_id.pop(self._entries[k].id, None)
            self._tokens -= self._entries[k].tokens
            k += 1
        del self._entries[:k]

    def _fits(self, n: int, used: int, tokens: int) -> bool:
        if n == 0:
            return True
        return (self.rpm is None or n < self.rpm) and (self.tpm is None or used + tokens <= self.tpm)

    def reserve(self, now: float, tokens: int) -> Reservation:
        """Book the earliest slot at or after `now` (and after every slot booked before) where `tokens` more fit."""
        self._prune(now)
        es = self._entries
        s = max(now, es[-1].t) if es else now
        lo, used = 0, self._tokens
        while lo < len(es) and es[lo].t + self.window_s <= s:  # outside: t + window <= s, the one float rule
            used -= es[lo].tokens
            lo += 1
        while not self._fits(len(es) - lo, used, tokens):
            oldest = es[lo].t  # the earliest time the window changes: the oldest entry (and its equals) leave it
            s = oldest + self.window_s
            while lo < len(es) and es[lo].t <= oldest:
                used -= es[lo].tokens
                lo += 1
        e = _Entry(self._next_id, s, tokens)
        self._next_id += 1
        es.append(e)
        self._by_id[e.id] = e
        self._tokens += tokens
        return Reservation(e.id, s)

    def settle(self, rid: int, tokens: int) -> None:
        """Replace a request's estimate with what the provider counted (a slot already gone from the window is ignored)."""
        e = self._by_id.get(rid)
        if e is not None:
            self._tokens += tokens - e.tokens
            e.tokens = tokens

    def booked(self) -> list[tuple[float, int]]:
        """(slot, tokens) of every request still in or ahead of the window, oldest first (for tests and diagnostics)."""
        return [(e.t, e.tokens) for e in self._entries]


class Limiter(Protocol):
    """What the agent calls before and after each request, whichever process or cluster the book lives in."""

    def acquire(self, tokens: int) -> tuple[Reservation, float]:
        """Wait until a request estimated at `tokens` may be sent; returns its reservation and the seconds waited."""
        ...

    def settle(self, reservation: Reservation, tokens: int) -> None:
        """Replace the request's estimate with what the provider counted."""
        ...


class RateLimiter:
    """A process's book (sliding 60-second window): `acquire` reserves under a lock, then sleeps until the slot."""

    def __init__(self, *, rpm: int | None = None, tpm: int | None = None, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.book = PaceBook(rpm=rpm, tpm=tpm, window_s=window_s)
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()

    @property
    def rpm(self) -> int | None:
        return self.book.rpm

    @property
    def tpm(self) -> int | None:
        return self.book.tpm

    def acquire(self, tokens: int) -> tuple[Reservation, float]:
        with self._lock:
            now = self._clock()
            r = self.book.reserve(now, tokens)
        wait = r.t - now
        if wait > 0:
            self._sleep(wait)
        return r, max(0.0, wait)

    def settle(self, reservation: Reservation, tokens: int) -> None:
        with self._lock:
            self.book.settle(reservation.id, tokens)


_LIMITERS: dict[tuple[str, str | None], Limiter] = {}
_REG_LOCK = threading.Lock()


def set_limiter(model: str, api_base: str | None, limiter: Limiter | None) -> None:
    """Pace every later request of this process to `model` (at `api_base`) through `limiter`; None removes pacing."""
    with _REG_LOCK:
        if limiter is None:
            _LIMITERS.pop((model, api_base), None)
        else:
            _LIMITERS[(model, api_base)] = limiter


def set_rate_limits(model: str, api_base: str | None = None, *, rpm: int | None = None, tpm: int | None = None) -> None:
    """Pace every later request of this process to `model` (at `api_base`) with a book of its own; both None removes pacing."""
    set_limiter(model, api_base, None if rpm is None and tpm is None else RateLimiter(rpm=rpm, tpm=tpm))


def limiter_for(model: str, api_base: str | None = None) -> Limiter | None:
    """The limiter this process's requests to `model` (at `api_base`) go through, or None (unpaced)."""
    with _REG_LOCK:
        return _LIMITERS.get((model, api_base))
