"""Paces a model's requests to its provider's rate limits (requests and tokens per minute) for every attempt of a process.

Concurrency alone does not keep a provider under its limits: a few fast attempts can burst past rpm/tpm and
earn 429s, whose backoff then differs between the arms that happen to run at that moment. Pacing before the
request keeps the load even; the time waited is charged like backoff (never to an attempt's working time).
Limits are per process: on Ray each worker process paces alone, so a cluster's total can exceed them (open).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable


@dataclass
class _Entry:
    t: float
    tokens: int


class RateLimiter:
    """A sliding 60-second window over requests and tokens; `acquire` blocks until one more request fits."""

    def __init__(self, *, rpm: int | None = None, tpm: int | None = None, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if rpm is not None and rpm < 1 or tpm is not None and tpm < 1:
            raise ValueError(f"rate limits must be >= 1 (rpm={rpm}, tpm={tpm})")
        self.rpm, self.tpm, self.window_s = rpm, tpm, window_s
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._entries: deque[_Entry] = deque()

    def _prune(self, now: float) -> None:
        while self._entries and now - self._entries[0].t >= self.window_s:
            self._entries.popleft()

    def _wait_needed(self, now: float, tokens: int) -> float:
        """0 when one more request of `tokens` fits now, else how long until the oldest entry leaves the window."""
        if not self._entries:
            return 0.0  # an empty window always admits one request, however large
        fits_r = self.rpm is None or len(self._entries) < self.rpm
        fits_t = self.tpm is None or sum(e.tokens for e in self._entries) + tokens <= self.tpm
        return 0.0 if fits_r and fits_t else self._entries[0].t + self.window_s - now

    def acquire(self, tokens: int) -> tuple[_Entry, float]:
        """Wait until a request estimated at `tokens` fits; returns its entry (for `settle`) and the seconds waited."""
        waited = 0.0
        while True:
            with self._lock:
                now = self._clock()
                self._prune(now)
                wait = self._wait_needed(now, tokens)
                if wait <= 0:
                    entry = _Entry(now, tokens)
                    self._entries.append(entry)
                    return entry, waited
            self._sleep(wait)
            waited += wait

    def settle(self, entry: _Entry, tokens: int) -> None:
        """Replace a request's estimate with what the provider counted."""
        with self._lock:
            entry.tokens = tokens


_LIMITERS: dict[tuple[str, str | None], RateLimiter] = {}
_REG_LOCK = threading.Lock()


def set_rate_limits(model: str, api_base: str | None = None, *, rpm: int | None = None, tpm: int | None = None) -> None:
    """Pace every later request of this process to `model` (at `api_base`); both None removes pacing."""
    with _REG_LOCK:
        if rpm is None and tpm is None:
            _LIMITERS.pop((model, api_base), None)
        else:
            _LIMITERS[(model, api_base)] = RateLimiter(rpm=rpm, tpm=tpm)


def limiter_for(model: str, api_base: str | None = None) -> RateLimiter | None:
    with _REG_LOCK:
        return _LIMITERS.get((model, api_base))
