"""A named lease (holder, fencing token, heartbeat, expiry) built only on the store's exclusive create.

Why only exclusive create: it is the one atomic primitive every backend has (local hard link,
memory://, S3 `If-None-Match: *`); S3 has no compare-and-swap on an object's body, so a lease
cannot be one file rewritten in place. A lease is instead a folder `<root>/_leases/<name>/` of
immutable, empty-bodied-but-for-the-holder files, all named `<token>.<what>`:

- `<T>.claim`: the acquisition of token T (one name per token, so exactly one process can create
  it); the body holds the holder and the first expiry.
- `<T>.<k>.<expires_ms>`: renewal k >= 1 of token T, the expiry in the name so a listing shows it.
- `<T>.released`: the holder of T gave it up; the lease is free.
- `<T>.void`: the acquirer of T backed off (see below); T never held the lease, and T-1's
  renewals still count.

The effective token is the highest one that is not void; the lease is held while that token is not
released and its newest renewal (or its claim) has not expired. `acquire` creates `<max+1>.claim`
exclusively,
so each token is won by one process only and tokens strictly increase (fencing). A holder that
renews late while someone takes the lease over is the only race; both sides write first and check
second, so at most one of them keeps it: the renewer re-lists after writing its renewal and gives up
when a newer non-void token exists; the acquirer re-lists after creating its token and voids it
when the token it replaced was renewed meanwhile. In the rare interleaving where both give up, the
renewer also marks its token released, so the lease is free again at once.

Expiry is judged on the reader's wall clock: hosts sharing a lease must have clocks within a small
fraction of `ttl_s` (NTP); a holder that may have overrun its expiry must fence its writes with the
token rather than trust it still holds. Old files are removed by the next acquirer (every token
below its own) and by each renewal (the holder's earlier renewals), so a folder holds a few files.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

from mkb.events._commit import commit
from mkb.events._store import Store, resolve_store

LEASES_DIR = "_leases"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:=@+-]*(/[A-Za-z0-9][A-Za-z0-9._:=@+-]*)*")
_FILE = re.compile(r"(\d{12})\.(?:(\d+)\.(\d+)|(released|void|claim))")


class LeaseLost(Exception):
    """The lease expired and another holder took it: stop acting on it (its token is stale)."""


@dataclass(frozen=True)
class LeaseInfo:
    """Who holds a lease now, with its fencing token and when it expires (epoch seconds, holder's clock)."""

    name: str
    holder: str
    token: int
    expires_at: float


@dataclass
class _Token:
    renewals: dict[int, tuple[int, str]]  # k -> (expires_ms, file path); k = 0 is the claim, its expiry read from its body
    released: bool = False
    void: bool = False

    @property
    def latest_k(self) -> int:
        return max(self.renewals, default=-1)

    def latest(self, store: Store) -> tuple[int, str] | None:
        """(expires_ms, path) of the newest renewal; the claim's body is read only when there is no renewal yet."""
        if not self.renewals:
            return None
        exp_ms, path = self.renewals[self.latest_k]
        if exp_ms < 0:
            try:
                exp_ms = round(json.loads(store.fs.cat_file(path))["expires_at"] * 1000)
            except (FileNotFoundError, KeyError):  # removed by a newer acquirer since the listing (memory:// raises KeyError)
                return None
            except (ValueError, TypeError):
                exp_ms = 0  # an unreadable claim holds nothing
        return exp_ms, path


@dataclass
class _State:
    tokens: dict[int, _Token]

    @property
    def max_token(self) -> int:
        return max(self.tokens, default=0)

    def effective(self) -> tuple[int, _Token] | None:
        for t in sorted(self.tokens, reverse=True):
            if not self.tokens[t].void:
                return t, self.tokens[t]
        return None

    def live(self, store: Store, now_ms: int) -> tuple[int, _Token, int, str] | None:
        """(token, its files, expires_ms, newest renewal path) of the live holder, or None."""
        eff = self.effective()
        if eff is None or eff[1].released:
            return None
        latest = eff[1].latest(store)
        return (*eff, *latest) if latest is not None and latest[0] > now_ms else None

    def newer_than(self, token: int) -> bool:
        return any(t > token and not tok.void for t, tok in self.tokens.items())


def _folder(store: Store, name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name.split("/"):
        raise ValueError(f"lease name {name!r} is not a path of [A-Za-z0-9._:=@+-] segments\nhint: e.g. 'compact/verdict' or 'claim/<coordinate hash>'")
    return f"{store.root}/{LEASES_DIR}/{name}"


def _list(store: Store, folder: str) -> _State:
    try:
        if store.is_local:
            import os

            names = os.listdir(folder)
        else:
            names = [str(p).rstrip("/").rsplit("/", 1)[-1] for p in store.ls(folder, refresh=True)]
    except FileNotFoundError:
        names = []
    tokens: dict[int, _Token] = {}
    for n in names:
        m = _FILE.fullmatch(n)
        if not m:
            continue
        tok = tokens.setdefault(int(m[1]), _Token({}))
        if m[4] == "claim":
            tok.renewals[0] = (-1, f"{folder}/{n}")
        elif m[4] == "released":
            tok.released = True
        elif m[4] == "void":
            tok.void = True
        else:
            tok.renewals[int(m[2])] = (int(m[3]), f"{folder}/{n}")
    return _State(tokens)


def _create(store: Store, path: str, body: bytes = b"") -> bool:
    """Exclusive create; False when the name exists."""
    try:
        commit(store, path, body)
        return True
    except FileExistsError:
        return False


def _remove(store: Store, path: str) -> None:
    try:
        store.fs.rm_file(path)
    except FileNotFoundError:
        pass


def _body(holder: str, token: int, expires_ms: int) -> bytes:
    return json.dumps({"holder": holder, "token": token, "expires_at": expires_ms / 1000}).encode()


class Lease:
    """A held lease; obtain one with `Lease.acquire`, keep it with `renew` every ttl/3 or so, end it with `release`."""

    def __init__(self, store: Store, name: str, *, holder: str, token: int, ttl_s: float, expires_at: float, renewal: int = 0) -> None:
        self.store, self.name, self.holder, self.token, self.ttl_s = store, name, holder, token, ttl_s
        self.expires_at = expires_at
        self._k = renewal
        self._folder = _folder(store, name)
        self._released = False

    def __repr__(self) -> str:
        return f"Lease({self.name!r}, holder={self.holder!r}, token={self.token}, expires_at={self.expires_at:.3f})"

    @classmethod
    def acquire(cls, store: str | Store | None, name: str, *, holder: str, ttl_s: float = 60.0) -> "Lease | None":
        """The lease, or None while a live holder (this same `holder` string included) has it."""
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        store = resolve_store(store, for_writing=True)
        folder = _folder(store, name)
        now_ms = int(time.time() * 1000)
        state = _list(store, folder)
        if state.live(store, now_ms) is not None:
            return None
        eff = state.effective()
        replaced = None if eff is None or eff[1].released else (eff[0], eff[1].latest_k)
        token = state.max_token + 1
        exp_ms = now_ms + int(ttl_s * 1000)
        if not _create(store, f"{folder}/{token:012d}.claim", _body(holder, token, exp_ms)):
            return None  # another acquirer won this token
        after = _list(store, folder)
        if replaced is not None:
            prev = after.tokens.get(replaced[0])
            if prev is not None and not prev.released and prev.latest_k > replaced[1]:
                _create(store, f"{folder}/{token:012d}.void")  # the holder we replaced renewed meanwhile: it keeps the lease
                return None
        for t, tok in after.tokens.items():  # older tokens can no longer matter: ours is the effective one
            if t < token:
                for _, path in tok.renewals.values():
                    _remove(store, path)
                for marker in ("released", "void"):
                    if getattr(tok, marker):
                        _remove(store, f"{folder}/{t:012d}.{marker}")
        return cls(store, name, holder=holder, token=token, ttl_s=ttl_s, expires_at=exp_ms / 1000)

    def renew(self) -> None:
        """Extend the expiry by ttl_s from now; raises LeaseLost when another holder has taken the lease (even after our expiry, renewing succeeds while nobody has)."""
        if self._released:
            raise LeaseLost(f"lease {self.name!r} (token {self.token}) was released by this holder")
        before = _list(self.store, self._folder)
        if before.newer_than(self.token) or self.token not in before.tokens or before.tokens[self.token].released:
            self._lose()
        now_ms = int(time.time() * 1000)
        k = max(self._k, before.tokens[self.token].latest_k) + 1
        exp_ms = now_ms + int(self.ttl_s * 1000)
        _create(self.store, f"{self._folder}/{self.token:012d}.{k}.{exp_ms}", _body(self.holder, self.token, exp_ms))
        after = _list(self.store, self._folder)
        if after.newer_than(self.token):
            self._lose()
        self._k, self.expires_at = k, exp_ms / 1000
        for j, (_, path) in after.tokens[self.token].renewals.items():
            if 0 < j < k:  # the claim stays: it names the holder until the next acquirer removes it
                _remove(self.store, path)

    def _lose(self):
        self._released = True
        _create(self.store, f"{self._folder}/{self.token:012d}.released")  # harmless if a newer token holds; frees the lease if it backed off
        cur = Lease.peek(self.store, self.name)
        raise LeaseLost(
            f"lease {self.name!r}: token {self.token} of {self.holder!r} was taken over"
            + (f" by {cur.holder!r} (token {cur.token})" if cur else "")
            + "\nhint: renew more often than ttl_s, and stop writing under a lost lease"
        )

    def release(self) -> None:
        """Give the lease up now (idempotent; a no-op when it was already lost)."""
        if self._released:
            return
        self._released = True
        _create(self.store, f"{self._folder}/{self.token:012d}.released")

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    @staticmethod
    def peek(store: str | Store | None, name: str) -> LeaseInfo | None:
        """The live holder of `name`, or None when it is free (never taken, released, or expired)."""
        store = resolve_store(store)
        folder = _folder(store, name)
        for _ in range(5):
            live = _list(store, folder).live(store, int(time.time() * 1000))
            if live is None:
                return None
            token, _, exp_ms, path = live
            try:
                holder = json.loads(store.fs.cat_file(path))["holder"]
            except (FileNotFoundError, KeyError):
                continue  # the holder renewed and removed this renewal between our list and read
            return LeaseInfo(name=name, holder=holder, token=token, expires_at=exp_ms / 1000)
        return None
