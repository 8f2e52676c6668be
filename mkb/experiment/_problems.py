"""The problems an experiment plans over, read from their folders (number, family, hash) without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from mkb.problems import discover, problem_hash


@dataclass(frozen=True)
class ProblemRef:
    """What a plan needs of a problem: its number, family, folder name and content hash."""

    number: int
    name: str
    family: str
    hash: str


@cache
def all_problems() -> dict[int, ProblemRef]:
    out = {}
    for path in discover():
        d = path.parent if path.name == "problem.py" else path
        number = int(d.name.split("_", 1)[0])
        out[number] = ProblemRef(number, d.name, d.parent.name, problem_hash(d))
    return out
