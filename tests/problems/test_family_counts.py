"""The catalog has the six families with the sizes problem-catalog.md gives, and the CLI says so."""

from typer.testing import CliRunner

from mkb.cli.run import app
from mkb.problems._loader import problems

EXPECTED = {"attention": 18, "kv_cache": 8, "mlp_norm": 17, "moe": 8, "quantization": 10, "linear_attention": 13}


def test_the_suite_has_74_problems_in_six_families_of_the_catalog_sizes():
    counts: dict[str, int] = {}
    for p in problems():
        counts[p.meta.family] = counts.get(p.meta.family, 0) + 1
    assert counts == EXPECTED
    assert sorted(p.meta.number for p in problems()) == list(range(1, 75))


def test_problems_list_prints_the_family_counts():
    out = CliRunner().invoke(app, ["problems", "list"], terminal_width=200)
    assert out.exit_code == 0, out.output
    last = out.output.strip().splitlines()[-1]
    assert last.startswith("74 problems:")
    for fam, n in EXPECTED.items():
        assert f"{fam} {n}" in last
