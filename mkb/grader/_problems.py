"""Finds and imports a problem module for the grader: by number through mkb.problems, or from a problem.py path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _repo_problems_dir() -> Path:
    from mkb._resources import data_dir

    return Path(data_dir("problems"))


def problem_path(spec: int | str | Path) -> Path:
    """The problem.py that `spec` names: a number (NN), a problem folder, or a problem.py file."""
    if isinstance(spec, int) or (isinstance(spec, str) and spec.isdigit()):
        n = int(spec)
        hits = sorted(_repo_problems_dir().glob(f"*/{n:02d}_*/problem.py"))
        if not hits:
            raise ValueError(f"no problem numbered {n}\nhint: `mkb-run problems list` shows the catalog")
        return hits[0]
    p = Path(spec)
    if p.is_dir():
        p = p / "problem.py"
    if not p.is_file():
        raise ValueError(f"{spec} is neither a problem number nor a problem.py\nhint: pass --problem NN")
    return p


def load_problem(spec: int | str | Path) -> ModuleType:
    """Import the problem module fresh (pristine harness copy, never the candidate's)."""
    loader = None
    try:  # prefer the problem package's own loader once it exists
        from mkb import problems as _p

        loader = getattr(_p, "load_module", None)
    except ImportError:
        pass
    if loader is not None and (isinstance(spec, int) or (isinstance(spec, str) and spec.isdigit())):
        mod = loader(int(spec))
        if isinstance(mod, ModuleType):
            return mod
    path = problem_path(spec)
    name = f"mkb_problem_{path.parent.name}"
    specobj = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(specobj)
    sys.modules[name] = mod
    specobj.loader.exec_module(mod)
    return mod


def problem_number(spec: int | str | Path) -> int:
    if isinstance(spec, int) or (isinstance(spec, str) and spec.isdigit()):
        return int(spec)
    return int(problem_path(spec).parent.name.split("_")[0])
