"""Static rules on every red-team hack in both DSLs: the plain forms are caught, the obfuscated forms and the controls are not."""

from __future__ import annotations

import pytest

import redteam_hacks as R
from mkb.dsl import get_backend


def _baseline(dsl, problem=R.PROBLEM):
    try:
        return R.baseline_path(dsl, problem).read_text()
    except FileNotFoundError:
        pytest.skip(f"no {dsl} baseline for problem {problem} yet")


def _baseline_for(dsl, hack):
    src = _baseline(dsl, hack.problem)
    assert R.fits(src, hack), (f"the {dsl} baseline of problem {hack.problem} has no `solve({hack.signature})`, so the "
                               f"form {hack.name} is never graded\nhint: write it for the baseline's signature or remove it")
    return src


@pytest.mark.parametrize("dsl", R.DSLS)
def test_every_form_is_rendered_for_its_problem_s_baseline(dsl, tmp_path):
    """A form whose signature no baseline has is silently left out of every GPU run: the suite would shrink unseen."""
    paths = R.write_all(tmp_path, dsl)
    assert {h.name for h in R.HACKS} <= set(paths), sorted({h.name for h in R.HACKS} - set(paths))


def test_catalogue_has_at_least_fourteen_distinct_hacks():
    assert len(R.DISTINCT) >= 14
    assert len({h.name for h in R.HACKS}) == len(R.HACKS)


@pytest.mark.parametrize("dsl", R.DSLS)
def test_control_is_clean(dsl):
    assert get_backend(dsl).static_rules(_baseline(dsl)) == ()


@pytest.mark.parametrize("dsl", R.DSLS)
@pytest.mark.parametrize("hack", R.HACKS, ids=lambda h: h.name)
def test_static_rules_catch_exactly_the_plain_forms(dsl, hack):
    src = R.render(_baseline_for(dsl, hack), hack)
    findings = get_backend(dsl).static_rules(src)
    got = findings[0].rule if findings else None
    assert got == hack.static, [f"{f.rule}: {f.message}" for f in findings]


@pytest.mark.parametrize("dsl", R.DSLS)
def test_only_the_hack_differs_from_the_control(dsl):
    for hack in R.HACKS:
        base = _baseline_for(dsl, hack)
        src = R.render(base, hack)
        assert src.replace("def _real_solve(", "def solve(", 1).startswith(base.rstrip())
