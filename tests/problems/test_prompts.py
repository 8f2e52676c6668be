"""Task statements: both DSL variants of every problem differ only inside the DSL section."""

from __future__ import annotations

import pytest

from mkb.dsl import dsl_names
from mkb.problems import discover, load_problem
from mkb.problems._prompts import DSL_BEGIN, split_dsl_section, task_statement

_PATHS = discover()


@pytest.mark.parametrize("path", _PATHS, ids=[p.parent.name for p in _PATHS])
def test_variants_differ_only_inside_the_dsl_section(path):
    problem = load_problem(path)
    texts = {d: task_statement(problem, d).text for d in dsl_names()}
    parts = {d: split_dsl_section(t) for d, t in texts.items()}
    first, *rest = dsl_names()
    for d in rest:
        assert parts[d][0] == parts[first][0], "text before the DSL section differs"
        assert parts[d][2] == parts[first][2], "text after the DSL section differs"
    for d, (head, _, tail) in parts.items():
        for other in dsl_names():
            assert f"mkb/dsl/{other}.py" not in head + tail
    assert texts[first].count(DSL_BEGIN) == 1
    assert f"solve({', '.join(problem.meta.inputs)})" in parts[first][0]


def test_statement_names_problem_shapes_and_rules():
    from mkb.problems import get_problem

    t = task_statement(get_problem(28), "cute")
    assert "bfloat16[14509, 4096]" in t.text and "eps" in t.text
    assert "torch.compile" in t.text and "fp64 anchor" in t.text
    with pytest.raises(ValueError, match="hint"):
        task_statement(get_problem(28), "cobol")


def test_each_dsl_has_its_own_section():
    from mkb.problems._prompts import dsl_section

    sections = {d: dsl_section(d)[0] for d in dsl_names()}
    if any("placeholder" in s.lower() for s in sections.values()):
        pytest.skip("a backend's prompt_section() is still a placeholder")
    assert len(set(sections.values())) == len(sections)


def test_the_statement_includes_the_shared_helpers_the_problem_imports():
    """An fp8 problem's numerics live partly in mkb/problems/quant.py: the agent must see that source too."""
    from mkb.problems._loader import get_problem
    from mkb.problems._prompts import common_statement

    text = common_statement(get_problem("52"))
    assert "## Imported by problem.py: mkb/problems/quant.py" in text
    assert "def fp8_quantize" in text
    assert "Imported by problem.py" not in common_statement(get_problem("29"))
