"""Cluster-wide pacing on Ray: one named actor per (model, api_base) owns the reservation book every worker process reserves from.

Each attempt task would otherwise pace alone in its worker process, and the cluster's total could exceed the
provider's rpm/tpm. The actor only books slots (`mkb.agent._pace.PaceBook`) and answers at once with how long to
wait; the attempt sleeps in its own process (charged like backoff), so the actor never blocks and one slow caller
delays nobody. A wait is a duration, so no two nodes' clocks are compared; a request goes out at its slot plus the
reply's latency (about a millisecond), never before it. The actor is named in a namespace per experiment (`mkb-pace/<experiment>`) and fetched with
`get_if_exists`, so a second driver of the same experiment on the cluster shares it; it is owned by the driver
that created it and ends with it. A dead actor or a lost Ray fails the request with a one-line error naming the
model, never an unpaced send and never a hang; the driver then finds the actor gone and stops the run (rather than
retrying and excluding every arm of that model).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from mkb.agent._pace import Limiter, PaceBook, PacingUnavailable, Reservation

Key = tuple[str, str | None]  # (model name, api_base)

RESERVE_TIMEOUT_S = 30.0  # a reservation is answered in microseconds; this long means the actor or Ray is gone


class PaceActorImpl:
    """The cluster's book for one (model, api_base); its clock is the actor's, callers get durations back."""

    def __init__(self, rpm: int | None, tpm: int | None, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.book = PaceBook(rpm=rpm, tpm=tpm, window_s=window_s)
        self._clock = clock

    def configure(self, rpm: int | None, tpm: int | None) -> tuple[int | None, int | None]:
        self.book.configure(rpm=rpm, tpm=tpm)
        return self.book.rpm, self.book.tpm

    def reserve(self, tokens: int) -> tuple[int, float, float]:
        """Book the next slot for `tokens`: (id, slot on the actor's clock, seconds the caller must wait from now)."""
        now = self._clock()
        r = self.book.reserve(now, tokens)
        return r.id, r.t, max(0.0, r.t - now)

    def settle(self, rid: int, tokens: int) -> None:
        self.book.settle(rid, tokens)

    def booked(self) -> list[tuple[float, int]]:
        return self.book.booked()


def actor_name(model: str, api_base: str | None) -> str:
    return f"{model}@{api_base or 'default'}"


def namespace(experiment: str) -> str:
    return f"mkb-pace/{experiment}"


class RayLimiter:
    """The `Limiter` an attempt sees on Ray: reserves a slot from the cluster's actor, then sleeps here until it."""

    def __init__(self, handle: Any, *, model: str, api_base: str | None, where: str = "", timeout_s: float = RESERVE_TIMEOUT_S,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.handle, self.model, self.api_base = handle, model, api_base
        self.where = where or f"actor {actor_name(model, api_base)!r}"
        self.timeout_s, self._sleep = timeout_s, sleep

    def acquire(self, tokens: int) -> tuple[Reservation, float]:
        import ray

        try:
            rid, slot, wait = ray.get(self.handle.reserve.remote(tokens), timeout=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - dead actor, lost GCS, timeout: all mean no pacing, so no request
            raise PacingUnavailable(
                f"model {self.model}: the cluster's rate limiter ({self.where}) did not answer: {_detail(exc)}"
                "\nhint: its actor died or Ray is gone; check `ray status` and the driver's log, then run again "
                "(the same plan resumes; finished attempts are kept)") from None
        if wait > 0:
            self._sleep(wait)
        return Reservation(rid, slot), wait

    def settle(self, reservation: Reservation, tokens: int) -> None:
        """Fire and forget: the count only tightens later reservations, and a dead actor fails the next `acquire`."""
        try:
            self.handle.settle.remote(reservation.id, tokens)
        except Exception:  # noqa: BLE001 - see above
            pass


def _detail(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:200]


def start_pacers(experiment: str, models: Any, *, window_s: float = 60.0) -> dict[Key, Any]:
    """On the driver: get or create the actor of every model with rpm/tpm, with this config's limits.

    The actor is pinned to the driver's node (it needs no CPU), so it is lost only with the driver's node.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from mkb.experiment._ray import _ray

    ray = _ray()
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    Actor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1)(PaceActorImpl)
    ns = namespace(experiment)
    out: dict[Key, Any] = {}
    for m in models:
        rpm, tpm = m.rpm or None, m.tpm or None
        if rpm is None and tpm is None:
            continue
        name = actor_name(m.config.name, m.config.api_base)
        try:
            h = Actor.options(name=name, namespace=ns, get_if_exists=True, scheduling_strategy=here).remote(rpm, tpm, window_s)
            ray.get(h.configure.remote(rpm, tpm), timeout=RESERVE_TIMEOUT_S)  # an existing actor takes this driver's limits
        except Exception as exc:  # noqa: BLE001 - one line for the CLI
            raise PacingUnavailable(f"model {m.config.name}: cannot start the cluster's rate limiter (actor {name!r} in "
                                    f"namespace {ns!r}): {_detail(exc)}\nhint: check `ray status`") from None
        out[(m.config.name, m.config.api_base)] = h
    return out


def check_pacers(pacers: Mapping[Key, Any], experiment: str) -> None:
    """On the driver, after an attempt failed: raise if a pacer is gone, so the run stops instead of excluding every arm."""
    import ray

    ns = namespace(experiment)
    for (model, base), h in pacers.items():
        try:
            ray.get(h.booked.remote(), timeout=RESERVE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - see RayLimiter.acquire
            raise PacingUnavailable(
                f"model {model}: the cluster's rate limiter (actor {actor_name(model, base)!r} in namespace {ns!r}) is gone: "
                f"{_detail(exc)}\nhint: check `ray status` and run again (the same plan resumes; finished attempts are kept)") from None


def ray_limiters(pacers: Mapping[Key, Any], experiment: str) -> dict[Key, Limiter]:
    """In any process of the cluster: the limiters to install for `pacers` (handles from `start_pacers`)."""
    ns = namespace(experiment)
    return {k: RayLimiter(h, model=k[0], api_base=k[1], where=f"actor {actor_name(*k)!r} in namespace {ns!r}")
            for k, h in pacers.items()}
