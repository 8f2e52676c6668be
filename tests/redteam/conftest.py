"""Red-team fixtures: the hack catalogue importable, and the CPU-only fake DSL from tests/grader."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent / "grader"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

