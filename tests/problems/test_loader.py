"""Discovery and validation: a malformed problem is refused with an error naming its file."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from mkb.problems import ProblemError, discover, get_problem, load_problem, problem_hash, problems

GOOD = '''
"""A tiny problem for loader tests."""
import torch
from mkb.problems._contract import Output, ProblemMeta

META = ProblemMeta(number=27, name="tiny", family="mlp_norm", dtypes=("fp32",), source_model="m",
                   source_config="c", inputs=("x",), outputs=(Output("y"),), flops=1.0, bytes=8.0, peak="memory")


def reference(x):
    return x * 2


def make_inputs(seed, *, device="cpu", size="full"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(4, generator=g).to(device),)
'''


def _write(root: Path, rel: str, text: str) -> Path:
    f = root / rel / "problem.py"
    f.parent.mkdir(parents=True)
    f.write_text(textwrap.dedent(text))
    return f


def test_a_well_formed_problem_loads(tmp_path):
    f = _write(tmp_path, "mlp_norm/27_tiny", GOOD)
    p = load_problem(f)
    assert (p.number, p.name, p.family, p.slug) == (27, "tiny", "mlp_norm", "27_tiny")
    assert not p.has_eager and p.eager is p.reference
    assert discover(tmp_path) == (f,)


@pytest.mark.parametrize(
    "rel, edit, message",
    [
        ("mlp_norm/27_tiny", lambda s: s.replace("META = ", "_META = "), "no META"),
        ("mlp_norm/27_tiny", lambda s: s.replace("def reference", "def _reference"), "no reference"),
        ("mlp_norm/27_tiny", lambda s: s.replace("def make_inputs", "def _make_inputs"), "no make_inputs"),
        ("mlp_norm/28_tiny", lambda s: s, "META.number is 27 but the folder says 28"),
        ("mlp_norm/27_small", lambda s: s, "differs from the folder name"),
        ("moe/27_tiny", lambda s: s, "lives under 'moe'"),
        ("mlp_norm/27_tiny", lambda s: s.replace('family="mlp_norm"', 'family="gemm"'), "unknown family"),
        ("mlp_norm/27_tiny", lambda s: s.replace('peak="memory"', 'peak="memory", mutates=("z",)'), "META.mutates names ['z']"),
        ("mlp_norm/27_tiny", lambda s: s.replace('Output("y")', 'Output("y", compare="topk", topk_scores="nope")'), "names no module function"),
        ("mlp_norm/27_tiny", lambda s: s.replace('Output("y")', 'Output("y", compare="fuzzy")'), "unknown compare mode"),
        ("mlp_norm/27_tiny", lambda s: s.replace('*, device="cpu", size="full"', "device"), "does not accept size="),
        ("mlp_norm/27_tiny", lambda s: s + "\nraise RuntimeError('boom')\n", "import failed: RuntimeError: boom"),
    ],
)
def test_a_malformed_problem_is_refused_naming_its_file(tmp_path, rel, edit, message):
    f = _write(tmp_path, rel, edit(GOOD))
    with pytest.raises(ProblemError) as err:
        load_problem(f)
    assert str(f) in str(err.value) and message in str(err.value) and "hint:" in str(err.value)


def test_a_problem_folder_without_problem_py_is_an_error(tmp_path):
    (tmp_path / "mlp_norm" / "27_tiny").mkdir(parents=True)
    with pytest.raises(ProblemError, match="without problem.py"):
        discover(tmp_path)


def test_duplicate_numbers_are_refused(tmp_path):
    _write(tmp_path, "mlp_norm/27_tiny", GOOD)
    _write(tmp_path, "mlp_norm/27_other", GOOD.replace('name="tiny"', 'name="other"'))
    with pytest.raises(ProblemError, match="also used by"):
        problems(root=tmp_path)


def test_hash_covers_the_problem_files_but_not_the_baseline_solutions(tmp_path):
    f = _write(tmp_path, "mlp_norm/27_tiny", GOOD)
    h0 = problem_hash(f.parent)
    (f.parent / "cute.py").write_text("def solve(x): ...\n")
    assert problem_hash(f.parent) == h0
    f.write_text(GOOD.replace("x * 2", "x * 3"))
    assert problem_hash(f.parent) != h0


def test_the_shipped_problems_load_and_are_found_by_number_and_name():
    ps = problems()
    assert {28, 29} <= {p.number for p in ps}
    assert get_problem(28).name == "fused_add_rmsnorm_h4096_llama31_8b_bf16"
    assert get_problem("29_gelu_feedforward_flux_fp32").number == 29
    assert get_problem("28") is get_problem(28)
    assert all(p.family == "mlp_norm" for p in problems(family="mlp_norm"))
    with pytest.raises(KeyError, match="hint"):
        get_problem(0)


def test_hash_covers_the_shared_helper_modules_a_problem_imports(tmp_path, monkeypatch):
    from mkb.problems import _loader

    f = _write(tmp_path, "mlp_norm/27_tiny", "from mkb.problems.quant import compute_dtype\n" + GOOD)
    plain = _write(tmp_path, "mlp_norm/28_plain", GOOD.replace("number=27", "number=28"))
    helpers = [p.name for p in _loader.shared_helpers(f)]
    assert helpers == ["quant.py"]
    assert _loader.shared_helpers(plain) == []
    h0, h_plain = problem_hash(f.parent), problem_hash(plain.parent)
    fake = tmp_path / "quant.py"
    fake.write_text("# a changed encoding\n")
    monkeypatch.setattr(_loader, "shared_helpers", lambda pf: [fake] if "quant" in pf.read_text() else [])
    assert problem_hash(f.parent) != h0  # the helper's bytes are part of the identity
    assert problem_hash(plain.parent) == h_plain
