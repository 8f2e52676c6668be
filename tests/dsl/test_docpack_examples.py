"""The doc packs' worked examples: mini problems in the catalog's format, each with its kernel in the pack's DSL.

They teach the agent (the workspace gets the pack of its target DSL only, so each pack holds its own
copy of the problem and only its own DSL's kernel) and are graded like baselines with
`mkb-run grade --baselines --problems-root <pack>/examples`, so here they are held to the baselines'
CPU bar: the problem loads and passes the contract, its reference runs at smoke size, the kernel
passes the static rules and compiles for sm_90a.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mkb.dsl import BACKENDS, baseline_files, get_backend
from mkb.problems import baselines, problems
from mkb.problems._loader import PROBLEMS_ROOT_ENV

DSLS = tuple(BACKENDS)


def _root(dsl: str) -> Path:
    return get_backend(dsl).doc_pack() / "examples"


def _relative_problems(dsl: str) -> dict[str, bytes]:
    root = _root(dsl)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.glob("*/*/problem.py"))}


@pytest.mark.parametrize("dsl", DSLS)
def test_examples_are_valid_problems_outside_the_catalog(dsl: str) -> None:
    ex = problems(root=_root(dsl))
    catalog = {p.number for p in problems()}
    assert len(ex) >= 2 and all(p.number >= 91 for p in ex) and not ({p.number for p in ex} & catalog)
    for p in ex:
        out = p.reference(*p.make_inputs(0, size="smoke"))
        again = p.reference(*p.make_inputs(1, size="smoke"))
        assert isinstance(out, torch.Tensor) and out.numel() > 0 and not torch.equal(out, again), p.slug


@pytest.mark.parametrize("dsl", DSLS)
def test_each_pack_holds_its_own_kernel_and_no_other_dsl(dsl: str) -> None:
    files = baseline_files()  # kernel file name -> DSL
    root = _root(dsl)
    found = baselines(root=root)
    assert {b.dsl for b in found} == {dsl}
    assert {b.problem for b in found} == {p.number for p in problems(root=root)}
    others = [n for n, d in files.items() if d != dsl]
    assert not [f for f in root.rglob("*.py") if f.name in others]


def test_both_packs_state_the_same_problems() -> None:
    first, *rest = (_relative_problems(d) for d in DSLS)
    assert first and all(r == first for r in rest), "the example problem.py copies differ between the doc packs"


def test_problems_root_env_points_every_lookup_at_the_examples(monkeypatch) -> None:
    from mkb.problems import find_problem, load_problem_module
    from mkb.problems._loader import ProblemError, problems_root

    root = _root(DSLS[0])
    monkeypatch.setenv(PROBLEMS_ROOT_ENV, str(root))
    assert problems_root() == root.resolve()
    assert find_problem(91).is_relative_to(root.resolve())
    assert load_problem_module(91).META.number == 91
    monkeypatch.setenv(PROBLEMS_ROOT_ENV, str(root / "missing"))
    with pytest.raises(ProblemError, match=PROBLEMS_ROOT_ENV):
        problems_root()


@pytest.mark.dsl
@pytest.mark.slow
@pytest.mark.parametrize("example", [b for d in DSLS for b in baselines(root=_root(d))],
                         ids=lambda b: f"{b.problem}-{b.dsl}")
def test_example_kernel_passes_static_rules_and_compiles_for_sm90a(example, monkeypatch) -> None:
    b = get_backend(example.dsl)
    assert b.static_rules(example.path.read_text()) == ()
    monkeypatch.setenv(PROBLEMS_ROOT_ENV, str(_root(example.dsl)))  # the check process inherits it
    res = b.check_compile(example.path, example.problem)
    assert res.ok, res.messages
    assert "sm_90a" in res.messages[0]
