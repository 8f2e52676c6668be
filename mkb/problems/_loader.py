"""Discovers `problems/<family>/NN_name/problem.py`, validates each against the contract, and loads it.

A malformed problem raises `ProblemError` naming its file and what is wrong, so a problem author
sees the mistake at `mkb-run problems list` rather than deep inside a grader run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, get_args

from mkb._resources import data_dir
from mkb.problems._contract import FAMILIES, CompareMode, Output, Peak, ProblemMeta, Upstream

_DIR_RE = re.compile(r"^(\d{2})_([a-z0-9_]+)$")


def _baseline_files() -> dict[str, str]:
    """Baseline solution file name -> DSL, from the DSL registry (baselines are not part of a problem's identity)."""
    from mkb.dsl import baseline_files

    return baseline_files()


class ProblemError(ValueError):
    """A problem module that does not follow the contract in mkb/problems/_contract.py."""


@dataclass(frozen=True, eq=False)
class Problem:
    """One loaded, validated problem."""

    meta: ProblemMeta
    module: ModuleType
    path: Path  # .../problems/<family>/NN_name/problem.py
    hash: str  # sha256 of the problem's files (solutions excluded)

    @property
    def number(self) -> int:
        return self.meta.number

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def family(self) -> str:
        return self.meta.family

    @property
    def dir(self) -> Path:
        return self.path.parent

    @property
    def slug(self) -> str:
        return f"{self.meta.number:02d}_{self.meta.name}"

    @property
    def reference(self) -> Callable[..., Any]:
        return self.module.reference

    @property
    def has_eager(self) -> bool:
        return callable(getattr(self.module, "eager", None))

    @property
    def eager(self) -> Callable[..., Any]:
        """What the eager baseline times: `eager` if the problem defines it, else `reference`."""
        return self.module.eager if self.has_eager else self.module.reference

    def make_inputs(self, seed: int, *, device: Any = "cpu", size: str = "full") -> tuple:
        out = self.module.make_inputs(seed, device=device, size=size)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    @property
    def docstring(self) -> str:
        return inspect.getdoc(self.module) or ""


def shared_helpers(problem_file: Path) -> list[Path]:
    """The mkb.problems helper modules (paged, quant, routing, ...) a problem.py imports.

    They define part of the problem's semantics (encodings, page tables, routing), so they belong
    to its identity; the contract module (`_contract`) does not, it only declares metadata.
    """
    import ast

    from mkb._ast import parse

    pkg = Path(__file__).resolve().parent
    names: set[str] = set()
    try:
        tree = parse(problem_file.read_text(), str(problem_file))
    except (OSError, SyntaxError):
        return []  # the loader reports an unreadable problem.py itself
    for node in ast.walk(tree):
        mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in getattr(node, "names", [])] if isinstance(node, ast.Import) else []
        for mod in mods:
            parts = mod.split(".")
            if parts[:2] == ["mkb", "problems"] and len(parts) > 2 and not parts[2].startswith("_"):
                names.add(parts[2])
    return [pkg / f"{n}.py" for n in sorted(names) if (pkg / f"{n}.py").is_file()]


def problem_hash(problem_dir: Path) -> str:
    """sha256 over the relative paths and bytes of the problem's files and the shared helpers it imports.

    Baselines (one `<dsl>.py` per registered DSL backend) can improve without changing what is being
    asked, so they are left out; anything else in the folder (data files the problem reads) is part of its identity, and
    so is every `mkb.problems` helper module problem.py imports (a change to an fp8 encoding or a page-table
    generator changes the problem even though its folder did not change).
    """
    h = hashlib.sha256()
    solutions = _baseline_files()
    for f in sorted(p for p in problem_dir.rglob("*") if p.is_file()):
        rel = f.relative_to(problem_dir).as_posix()
        if "__pycache__" in rel or rel.endswith((".pyc", ".pyo")) or rel in solutions:
            continue
        h.update(rel.encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    for helper in shared_helpers(problem_dir / "problem.py"):
        h.update(f"mkb/problems/{helper.name}".encode() + b"\0")
        h.update(helper.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


PROBLEMS_ROOT_ENV = "MKB_PROBLEMS_ROOT"


def problems_root() -> Path:
    """The catalog (`problems/`), or the folder `$MKB_PROBLEMS_ROOT` names.

    Why an environment variable: the grader loads a problem by number in its own worker processes,
    which inherit the environment, so one variable points every lookup of a run (CLI, workers, the
    compile check) at another root in the same format, such as a doc pack's worked examples, without
    a second way to load a problem.
    """
    override = os.environ.get(PROBLEMS_ROOT_ENV)
    if override:
        root = Path(override).expanduser().resolve()
        if not root.is_dir():
            raise ProblemError(f"{PROBLEMS_ROOT_ENV}={override}: no such folder\n"
                               f"hint: point it at a folder of <family>/NN_name/problem.py, or unset it for the catalog")
        return root
    return data_dir("problems")


def discover(root: Path | None = None) -> tuple[Path, ...]:
    """Every `<family>/NN_name/problem.py` under `root`, in problem-number order."""
    root = Path(root) if root is not None else problems_root()
    found = []
    for fam in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        for d in sorted(p for p in fam.iterdir() if p.is_dir() and _DIR_RE.match(p.name)):
            f = d / "problem.py"
            if not f.is_file():
                raise ProblemError(f"{d}: problem folder without problem.py\nhint: add problem.py or remove the folder")
            found.append(f)
    return tuple(sorted(found, key=lambda f: (f.parent.name, f.parent.parent.name)))


def _fail(path: Path, what: str, hint: str) -> ProblemError:
    return ProblemError(f"{path}: {what}\nhint: {hint}")


def validate(module: ModuleType, path: Path) -> ProblemMeta:
    """Check `module` (loaded from `path`) against the contract; returns its META or raises ProblemError."""
    meta = getattr(module, "META", None)
    if not isinstance(meta, ProblemMeta):
        raise _fail(path, "no META = ProblemMeta(...)", "declare META with mkb.problems.ProblemMeta")
    for fn in ("reference", "make_inputs"):
        if not callable(getattr(module, fn, None)):
            raise _fail(path, f"no {fn}() function", f"define {fn} as in mkb/problems/_contract.py")
    if hasattr(module, "eager") and not callable(module.eager):
        raise _fail(path, "eager is not callable", "define eager(*inputs) or remove it")
    params = inspect.signature(module.make_inputs).parameters
    for kw in ("device", "size"):
        if kw not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            raise _fail(path, f"make_inputs does not accept {kw}=", "signature: make_inputs(seed, *, device, size='full')")
    m = _DIR_RE.match(path.parent.name)
    if m is None:
        raise _fail(path, f"folder name {path.parent.name!r} is not NN_name", "name the folder like 28_fused_add_rmsnorm_...")
    if int(m.group(1)) != meta.number:
        raise _fail(path, f"META.number is {meta.number} but the folder says {m.group(1)}", "make them agree")
    if m.group(2) != meta.name:
        raise _fail(path, f"META.name {meta.name!r} differs from the folder name {m.group(2)!r}", "make them agree")
    if meta.family not in FAMILIES:
        raise _fail(path, f"unknown family {meta.family!r}", f"one of {', '.join(FAMILIES)}")
    if path.parent.parent.name != meta.family:
        raise _fail(path, f"META.family is {meta.family!r} but the file lives under {path.parent.parent.name!r}/",
                    "move the folder or fix META.family")
    if not meta.dtypes:
        raise _fail(path, "META.dtypes is empty", "list the dtypes, e.g. ('bf16',)")
    if not meta.inputs or len(set(meta.inputs)) != len(meta.inputs):
        raise _fail(path, f"META.inputs {meta.inputs} is empty or has duplicates", "one unique name per make_inputs value")
    names = [o.name for o in meta.outputs]
    if not meta.outputs or not all(isinstance(o, Output) for o in meta.outputs) or len(set(names)) != len(names):
        raise _fail(path, f"META.outputs {names} is empty, has duplicates or non-Output entries", "one Output(...) per returned value")
    for field_name in ("mutates", "structure_inputs", "fixed_inputs"):
        unknown = [n for n in getattr(meta, field_name, ()) if n not in meta.inputs]
        if unknown:
            raise _fail(path, f"META.{field_name} names {unknown}, which are not in META.inputs {meta.inputs}",
                        "use names from META.inputs")
    for row in getattr(meta, "insensitive_inputs", ()):
        if not (isinstance(row, tuple) and len(row) == 2 and row[0] in meta.inputs and str(row[1]).strip()):
            raise _fail(path, f"META.insensitive_inputs row {row!r} is not (an input from META.inputs, why)",
                        "give each exempt input with the reason its redraw can stay within tolerance at full size")
    for o in meta.outputs:
        if o.compare not in get_args(CompareMode):
            raise _fail(path, f"output {o.name!r} has unknown compare mode {o.compare!r}", f"one of {get_args(CompareMode)}")
        if o.compare == "topk" and not callable(getattr(module, o.topk_scores or "", None)):
            raise _fail(path, f"output {o.name!r} is topk but topk_scores={o.topk_scores!r} names no module function",
                        "define the score function and name it in Output(topk_scores=...)")
        if o.compare == "quantized" and not callable(getattr(module, o.dequantize or "", None)):
            raise _fail(path, f"output {o.name!r} is quantized but dequantize={o.dequantize!r} names no module function",
                        "define the dequantise function and name it in Output(dequantize=...)")
        if o.quantized_from is not None and not callable(getattr(module, o.quantized_from, None)):
            raise _fail(path, f"output {o.name!r} names quantized_from={o.quantized_from!r}, which is no module function",
                        "define the pre-quantisation values function, or leave quantized_from out")
    if meta.upstream is not None:  # optional until every problem is compared; when present it must be complete
        wrong = meta.upstream.problems() if isinstance(meta.upstream, Upstream) else ["it is not an Upstream(...)"]
        if wrong:
            raise _fail(path, f"META.upstream is incomplete: {'; '.join(wrong)}",
                        "every aspect of mkb.problems.UPSTREAM_ASPECTS goes once in matches or in differs with a reason")
    if meta.peak not in get_args(Peak):
        raise _fail(path, f"unknown peak {meta.peak!r}", f"one of {get_args(Peak)}")
    if not (meta.flops >= 0 and meta.bytes > 0):
        raise _fail(path, f"META.flops={meta.flops}, META.bytes={meta.bytes}", "give full-size FLOPs >= 0 and bytes > 0")
    return meta


def load_problem(path: Path | str) -> Problem:
    """Import and validate one problem.py."""
    path = Path(path).resolve()
    modname = f"mkb_problem_{path.parent.parent.name}_{path.parent.name}"
    spec = importlib.util.spec_from_file_location(modname, path)
    if spec is None or spec.loader is None:
        raise _fail(path, "cannot be imported", "is it a Python file?")
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(modname, None)
        raise _fail(path, f"import failed: {type(exc).__name__}: {exc}", "run the file with python to see the traceback") from exc
    meta = validate(module, path)
    return Problem(meta=meta, module=module, path=path, hash=problem_hash(path.parent))


@cache
def _load_all(root: Path) -> tuple[Problem, ...]:
    loaded = [load_problem(p) for p in discover(root)]
    seen: dict[int, Path] = {}
    for p in loaded:
        if p.number in seen:
            raise _fail(p.path, f"problem number {p.number} is also used by {seen[p.number]}", "numbers are unique (01-74)")
        seen[p.number] = p.path
    return tuple(sorted(loaded, key=lambda p: p.number))


def problems(*, family: str | None = None, root: Path | str | None = None) -> tuple[Problem, ...]:
    """All problems (loaded once per process), optionally of one family."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}\nhint: one of {', '.join(FAMILIES)}")
    allp = _load_all(Path(root).resolve() if root is not None else problems_root())
    return tuple(p for p in allp if family is None or p.family == family)


def get_problem(key: int | str, *, root: Path | str | None = None) -> Problem:
    """A problem by number (28 or "28"), name or NN_name."""
    allp = problems(root=root)
    for p in allp:
        if (isinstance(key, int) and p.number == key) or (isinstance(key, str) and (
                key in (p.name, p.slug) or (key.isdigit() and int(key) == p.number))):
            return p
    raise KeyError(f"no problem {key!r}\nhint: `mkb-run problems list` shows the {len(allp)} known problems")


def find_problem(spec: int | str | Path, *, root: Path | str | None = None) -> Path:
    """The problem.py that `spec` names, without importing any problem: a number (28 or "28"), a name or
    NN_name, a problem folder, or a problem.py file. The one lookup the grader, the DSL backends and the CLI use."""
    base = Path(root) if root is not None else problems_root()
    if isinstance(spec, int) or (isinstance(spec, str) and spec.isdigit()):
        n = int(spec)
        hits = sorted(base.glob(f"*/{n:02d}_*/problem.py"))
        if not hits:
            raise ProblemError(f"no problem numbered {n} under {base}\nhint: `mkb-run problems list` shows the catalog")
        return hits[0]
    p = Path(spec)
    if p.is_dir() and (p / "problem.py").is_file():
        return p / "problem.py"
    if p.is_file() and p.name == "problem.py":
        return p
    if isinstance(spec, str) and "/" not in spec and not spec.endswith(".py"):
        hits = sorted(f for f in base.glob("*/*/problem.py")
                      if f.parent.name == spec or (_DIR_RE.match(f.parent.name) and _DIR_RE.match(f.parent.name).group(2) == spec))
        if hits:
            return hits[0]
    raise ProblemError(f"{spec}: names no problem (neither a number, a name, a problem folder nor a problem.py)\n"
                       "hint: pass a number such as 28; `mkb-run problems list` shows the catalog")


def problem_number(spec: int | str | Path) -> int:
    """The number of the problem `spec` names (read from its folder name, nothing imported)."""
    if isinstance(spec, int) or (isinstance(spec, str) and spec.isdigit()):
        return int(spec)
    return int(find_problem(spec).parent.name.split("_")[0])


def load_problem_module(spec: int | str | Path) -> ModuleType:
    """A freshly imported, validated problem module (the grader's pristine copy, never one a candidate touched)."""
    return load_problem(find_problem(spec)).module


@dataclass(frozen=True)
class Baseline:
    """A baseline solution shipped in a problem folder: `<dsl>.py` beside problem.py, one per registered backend."""

    problem: int
    dsl: str
    path: Path


def baselines(which: Iterable[int | str] | None = None, *, dsls: Iterable[str] | None = None,
              root: Path | str | None = None) -> tuple[Baseline, ...]:
    """Every baseline found in the problem folders (of the problems `which` names, all by default), in
    (problem, registry) order. Discovered, never listed: a new baseline file is graded by the next run."""
    files = _baseline_files()  # file name -> dsl, registry order
    want_dsls = set(dsls) if dsls is not None else None
    if want_dsls is not None:
        unknown = sorted(want_dsls - set(files.values()))
        if unknown:
            raise ValueError(f"unknown DSL {', '.join(unknown)}\nhint: known DSLs are {', '.join(files.values())}")
    paths = [find_problem(w, root=root) for w in which] if which is not None else list(discover(root))
    out: list[Baseline] = []
    for f in dict.fromkeys(paths):
        number = int(f.parent.name.split("_")[0])
        for name, dsl in files.items():
            if (f.parent / name).is_file() and (want_dsls is None or dsl in want_dsls):
                out.append(Baseline(number, dsl, f.parent / name))
    return tuple(sorted(out, key=lambda b: b.problem))
