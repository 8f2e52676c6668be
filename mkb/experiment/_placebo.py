"""Chooses the placebo note of a block: generic kernel-writing text whose token length matches the transfer skill's.

The notes live in `placebo/*.md` (who wrote them and how: `placebo/README.md`). A placebo is a run of whole
sentences taken in file order from the start of a paragraph onward (possibly across notes), so no sentence is ever cut.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from mkb.experiment._tokens import TOKENIZER, count_tokens

PLACEBO_DIR = Path(__file__).parent / "placebo"
WINDOW = 0.10  # DESIGN: token length within 10% of the transfer skill's
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Placebo:
    """The text an arm gets and how well it matches: `flags` holds `placebo_length_mismatch` outside the window."""

    text: str
    sha256: str
    tokens: int
    target_tokens: int
    source: str  # "02_memory.md[0:7]+03_reductions.md[0:2]": which notes and sentence ranges
    flags: tuple[str, ...] = ()

    @property
    def ratio(self) -> float | None:
        return self.tokens / self.target_tokens if self.target_tokens else None


@cache
def _units() -> tuple[tuple[str, int, str, str], ...]:
    """(note file, index, separator before, sentence) in file order across every note."""
    files = sorted(PLACEBO_DIR.glob("*.md"))
    files = [f for f in files if f.name != "README.md"]
    if not files:
        raise FileNotFoundError(f"no placebo notes in {PLACEBO_DIR}\nhint: the package's placebo/*.md files are missing")
    out = []
    for f in files:
        i = 0
        for p_i, para in enumerate(p for p in f.read_text().split("\n\n") if p.strip()):
            for s_i, sent in enumerate(_SENTENCE.split(para.strip())):
                sep = " " if s_i else ("\n\n" if (p_i or out) else "")
                out.append((f.name, i, sep, sent))
                i += 1
    return tuple(out)


def notes_sha256() -> str:
    """One digest of the committed note set (recorded on the plan event)."""
    h = hashlib.sha256()
    for f in sorted(PLACEBO_DIR.glob("*.md")):
        if f.name != "README.md":
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def notes() -> dict[str, str]:
    """The committed note set, {file name: text} (recorded on the plan event)."""
    return {f.name: f.read_text() for f in sorted(PLACEBO_DIR.glob("*.md")) if f.name != "README.md"}


def _text(units) -> str:
    return "".join((sep if k else "") + s for k, (_, _, sep, s) in enumerate(units))


def _describe(units) -> str:
    parts: dict[str, list[int]] = {}
    for f, i, _, _ in units:
        parts.setdefault(f, []).append(i)
    return "+".join(f"{f}[{min(ix)}:{max(ix) + 1}]" for f, ix in parts.items())


def choose_placebo(target_tokens: int) -> Placebo:
    """The run of whole sentences whose token length is closest to `target_tokens` (ties: earliest, shortest).

    A run starts at the beginning of a paragraph (a note's heading included), so it opens with a whole thought.
    An empty target (the transfer source wrote no skill) gives an empty, flagged placebo, as the transfer arm gets.
    """
    if target_tokens <= 0:
        return Placebo("", hashlib.sha256(b"").hexdigest(), 0, 0, "", ("empty",))
    units = _units()
    lens = [count_tokens(s) + (1 if sep else 0) for (_, _, sep, s) in units]
    starts = [k for k, u in enumerate(units) if u[1] == 0 or u[2] == "\n\n"]
    est = []
    for st in starts:
        total = 0
        for end in range(st, len(units)):
            total += lens[end]
            est.append((abs(total - target_tokens), end - st, st, end))
            if total > target_tokens * (1 + WINDOW) + 50:
                break
    # token counts of a join are not exactly additive: count the 40 best estimates exactly
    exact = []
    for _, _, st, end in sorted(est)[:40]:
        text = _text(units[st:end + 1])
        exact.append((abs(count_tokens(text) - target_tokens), end - st, st, end, text))
    _, _, st, e, text = min(exact)
    tokens = count_tokens(text)
    flags = () if abs(tokens - target_tokens) <= WINDOW * target_tokens else ("placebo_length_mismatch",)
    return Placebo(text, hashlib.sha256(text.encode()).hexdigest(), tokens, target_tokens, _describe(units[st:e + 1]), flags)


__all__ = ["PLACEBO_DIR", "Placebo", "TOKENIZER", "WINDOW", "choose_placebo", "notes_sha256"]
