"""The upstream-fidelity record: validation of META.upstream, `problems diff-upstream`, and the README table."""

from __future__ import annotations

import textwrap

import pytest
from typer.testing import CliRunner

from mkb.cli.run import app
from mkb.problems import UPSTREAM_ASPECTS, ProblemError, Upstream, load_problem, problems
from mkb.problems._loader import problems_root
from mkb.problems._upstream import BEGIN, END, render_readme, upstream_rows

from test_loader import GOOD, _write

ALL_MATCH = f"upstream=Upstream(source='shipped', path='problems/x/27_tiny.py', matches={UPSTREAM_ASPECTS!r})"


def _with_upstream(tmp_path, upstream: str):
    text = GOOD.replace("from mkb.problems._contract import Output, ProblemMeta",
                        "from mkb.problems._contract import Output, ProblemMeta, Upstream")
    text = text.replace('peak="memory")', f'peak="memory", {upstream})')
    return _write(tmp_path, "mlp_norm/27_tiny", text)


def test_a_complete_record_loads(tmp_path):
    p = load_problem(_with_upstream(tmp_path, ALL_MATCH))
    assert p.meta.upstream.matches == UPSTREAM_ASPECTS


def test_a_problem_without_a_record_still_loads(tmp_path):
    assert load_problem(_write(tmp_path, "mlp_norm/27_tiny", GOOD)).meta.upstream is None


@pytest.mark.parametrize("upstream, message", [
    ("upstream=Upstream(source='shipped', path='p.py', matches=('computation',))", "neither in matches nor in differs"),
    ("upstream=Upstream(source='shipped', path='p.py', matches=" + repr(UPSTREAM_ASPECTS)
     + ", differs=(('shapes', 'smaller'),))", "more than once"),
    ("upstream=Upstream(source='shipped', path='p.py', matches=" + repr(UPSTREAM_ASPECTS[1:])
     + ", differs=(('computation', '  '),))", "gives no reason"),
    ("upstream=Upstream(source='shipped', path='p.py', matches=" + repr(UPSTREAM_ASPECTS + ("speed",)) + ")",
     "unknown aspects ['speed']"),
    ("upstream=Upstream(source='paper', path='p.py', matches=" + repr(UPSTREAM_ASPECTS) + ")", "source 'paper'"),
    ("upstream=Upstream(source='recipe', path='', matches=" + repr(UPSTREAM_ASPECTS) + ")", "path is empty"),
    ("upstream=('shipped',)", "not an Upstream"),
])
def test_an_incomplete_record_is_refused_naming_the_file(tmp_path, upstream, message):
    f = _with_upstream(tmp_path, upstream)
    with pytest.raises(ProblemError) as e:
        load_problem(f)
    assert str(f) in str(e.value) and message in str(e.value) and "hint:" in str(e.value)


def test_every_aspect_is_accounted_for_by_the_record_method():
    u = Upstream(source="recipe", path="r.json", matches=UPSTREAM_ASPECTS[:-1], differs=((UPSTREAM_ASPECTS[-1], "why"),))
    assert u.problems() == []


def test_every_problem_records_how_it_relates_to_upstream():
    missing = [p.slug for p in problems() if p.meta.upstream is None]
    assert not missing, f"{len(missing)} problems have no META.upstream: {', '.join(missing)}"


def test_the_committed_readme_table_is_up_to_date():
    readme = problems_root() / "README.md"
    current = readme.read_text()
    assert BEGIN in current and END in current
    assert current == render_readme(current, upstream_rows(problems())), \
        "problems/README.md is stale\nhint: run `mkb-run problems diff-upstream --write`"


def test_render_readme_replaces_only_the_generated_section():
    rows = upstream_rows(problems(family="kv_cache"))
    text = render_readme("# Title\n\nintro\n", rows)
    assert text.startswith("# Title\n\nintro\n") and text.count(BEGIN) == 1
    stale = text.replace("| 25 |", "| 99 |") + "\nafter\n"
    again = render_readme(stale, rows)
    assert again == text + "\nafter\n"


def test_diff_upstream_check_fails_on_a_stale_file_and_write_fixes_it(tmp_path):
    out = tmp_path / "README.md"
    out.write_text(textwrap.dedent("# P\n"))
    r = CliRunner().invoke(app, ["problems", "diff-upstream", "--check", "--out", str(out)])
    assert r.exit_code == 1 and "out of date" in r.output and "hint:" in r.output
    r = CliRunner().invoke(app, ["problems", "diff-upstream", "--write", "--out", str(out)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["problems", "diff-upstream", "--check", "--out", str(out)])
    assert r.exit_code == 0 and "up to date" in r.output


def test_diff_upstream_prints_each_problem_of_a_family():
    r = CliRunner().invoke(app, ["problems", "diff-upstream", "--family", "kv_cache"])
    assert r.exit_code == 0, r.output
    for p in problems(family="kv_cache"):
        assert p.slug in r.output
    r = CliRunner().invoke(app, ["problems", "diff-upstream", "--markdown", "--family", "kv_cache"])
    assert r.exit_code == 0 and "| # | problem | upstream |" in r.output
