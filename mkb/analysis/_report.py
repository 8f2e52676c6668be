"""The offline HTML report: small aggregated tables, altair charts inlined, optional PNG/SVG beside it."""

from __future__ import annotations

import html
import json
from pathlib import Path

import polars as pl

from mkb.analysis._stats import BootstrapSpec, lift_table, standing_table
from mkb.analysis._tables import NOISE_ARM, Tables

MAX_ROWS = 5000  # altair refuses more; every chart is aggregated well below this


def _check(df: pl.DataFrame, name: str) -> pl.DataFrame:
    if df.height > MAX_ROWS:
        raise ValueError(f"chart {name!r} would embed {df.height} rows (> {MAX_ROWS})\nhint: aggregate further before charting")
    return df


def charts(tables: Tables, lift: pl.DataFrame, standing: pl.DataFrame, family: pl.DataFrame) -> dict:
    """name -> altair chart, each from a pre-aggregated table of at most a few thousand rows."""
    import altair as alt

    out = {}
    lt = _check(lift.select("model", "arm_kind", "direction", "rel_lift", "rel_lo", "rel_hi")
                .with_columns((pl.col(c) * 100).alias(c) for c in ("rel_lift", "rel_lo", "rel_hi")), "lift")
    base = alt.Chart(lt).encode(y=alt.Y("model:N", title=None), color=alt.Color("arm_kind:N", title="arm"),
                                yOffset="arm_kind:N")
    out["lift_by_model"] = (
        base.mark_rule().encode(x=alt.X("rel_lo:Q", title="relative lift (%) with 95% CI"), x2="rel_hi:Q")
        + base.mark_point(filled=True).encode(x="rel_lift:Q", tooltip=list(lt.columns))
        + alt.Chart(pl.DataFrame({"x": [0.0]})).mark_rule(strokeDash=[4, 4]).encode(x="x:Q")
    ).facet(column=alt.Column("direction:N", title=None)).properties(title="Relative lift by model and direction")
    pp = tables.pairs.filter(pl.col("arm_kind") == "transfer").group_by("direction", "problem").agg(
        solo=pl.col("S_solo").mean(), transfer=pl.col("S").mean())
    slopes = _check(pp.unpivot(index=["direction", "problem"], variable_name="arm", value_name="S")
                    .join(pp.select("direction", "problem", sign=pl.when(pl.col("transfer") > pl.col("solo")).then(pl.lit("up"))
                                    .when(pl.col("transfer") < pl.col("solo")).then(pl.lit("down")).otherwise(pl.lit("flat"))),
                          on=["direction", "problem"]), "slopes")
    out["problem_slopes"] = alt.Chart(slopes).mark_line(opacity=0.5, point=True).encode(
        x=alt.X("arm:N", sort=["solo", "transfer"], title=None), y=alt.Y("S:Q", title="mean S over models and replicates"),
        detail="problem:N", color=alt.Color("sign:N", scale=alt.Scale(domain=["up", "flat", "down"], range=["#2a9d8f", "#bbbbbb", "#e76f51"])),
        tooltip=["problem", "arm", "S"],
    ).properties(width=220, height=300).facet(column="direction:N").properties(title="Per-problem paired slopes: solo -> transfer")
    if standing.height:
        rows = []
        for r in standing.iter_rows(named=True):
            for c in ("above", "tie", "below"):
                rows.append({"arm": r["arm_kind"], "direction": r["direction"], "standing": c,
                             "improve_minus_regress": (r[f"improve_{c}"] or 0) - (r[f"regress_{c}"] or 0), "n": r[f"n_{c}"]})
        st = _check(pl.DataFrame(rows), "standing")
        out["lift_vs_standing"] = alt.Chart(st).mark_bar().encode(
            x=alt.X("standing:N", sort=["below", "tie", "above"], title="source standing"),
            y=alt.Y("improve_minus_regress:Q", title="improve - regress share"),
            color=alt.Color("arm:N", sort=["transfer", "placebo", "wrong", "same", NOISE_ARM]),
            xOffset=alt.XOffset("arm:N", sort=["transfer", "placebo", "wrong", "same", NOISE_ARM]),
            tooltip=["arm", "direction", "standing", "improve_minus_regress", "n"],
        ).properties(width=260, height=240).facet(column="direction:N").properties(
            title="Lift against standing, beside the placebo, wrong skill and solo noise floor")
    if family.height:
        fam = _check(family.filter(pl.col("arm_kind") == "transfer").select(
            "family", cell=pl.format("{} {}", "model", "direction"), rel=pl.col("rel_lift") * 100), "family")
        out["family_heatmap"] = alt.Chart(fam).mark_rect().encode(
            x=alt.X("cell:N", title=None), y=alt.Y("family:N"),
            color=alt.Color("rel:Q", title="rel. lift %", scale=alt.Scale(scheme="redblue", domainMid=0)),
            tooltip=["family", "cell", "rel"]).properties(title="Transfer relative lift by family")
    return out


def _table_html(df: pl.DataFrame, cols: list[str], fmt: dict | None = None) -> str:
    fmt = fmt or {}
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for r in df.select(cols).iter_rows(named=True):
        cells = []
        for c in cols:
            v = r[c]
            if v is None:
                s = ""
            elif c in fmt:
                s = fmt[c](v)
            elif isinstance(v, float):
                s = f"{v:.3f}"
            else:
                s = str(v)
            cells.append(f"<td>{html.escape(s)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def write_report(tables: Tables, out_dir: str | Path, *, spec: BootstrapSpec = BootstrapSpec(),
                 formats: tuple[str, ...] = ()) -> Path:
    """Write report.html (self-contained: the Vega bundle is inlined once) plus each chart's data as CSV,
    its Vega-Lite JSON, and PNG/SVG when asked."""
    from altair.utils._importers import import_vl_convert
    from altair.utils.html import vl_version_for_vl_convert

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lift = lift_table(tables.pairs, spec=spec)
    fam = lift_table(tables.pairs, by=("family",), spec=spec, tests=False)
    standing = standing_table(tables.pairs, spec=spec)
    ch = charts(tables, lift, standing, fam)
    vlc = import_vl_convert()
    bundle = vlc.javascript_bundle(vl_version=vl_version_for_vl_convert())
    divs, scripts = [], []
    for name, chart in ch.items():
        spec_json = chart.to_dict()
        (out / f"{name}.vl.json").write_text(json.dumps(spec_json))
        for f in formats:
            chart.save(str(out / f"{name}.{f}"))
        divs.append(f'<h2>{html.escape(name.replace("_", " "))}</h2><div id="{name}"></div>')
        scripts.append(f"vegaEmbed('#{name}', {json.dumps(spec_json)}, {{actions: false}}).catch(console.error);")
    lift.write_csv(out / "lift.csv")
    standing.write_csv(out / "standing.csv") if standing.height else None
    s = tables.summary()
    pct = lambda v: f"{100 * v:+.1f}%"  # noqa: E731
    under = lift.filter(~pl.col("detects_10pct").fill_null(False))
    doc = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>mkb report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}} table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}} th{{background:#f4f4f4}}</style>
<script type="text/javascript">{bundle}</script></head><body>
<h1>MetaKernelBench analysis</h1>
<p>store: <code>{html.escape(tables.store)}</code>; attempts {s['attempts']}, counted {s['included']};
excluded: infra_error {s['infra_error']}, unfinished {s['unfinished']}, annotated {s['annotated']}, ungraded {s['ungraded']}.
{'<b>Stratified by version</b>.' if tables.stratified else ''}</p>
<p>{html.escape(tables.verdict_note())}.</p>
<p>{html.escape(spec.describe())}. A cell whose relative-lift CI half-width exceeds 10 points could not detect a 10% lift:
{under.height} of {lift.height} cells ({html.escape(', '.join(f"{r['model']} {r['arm_kind']} {r['direction']}" for r in under.iter_rows(named=True))[:2000])}).</p>
<h2>Lift table</h2>
{_table_html(lift, ["model", "arm_kind", "direction", "n_pairs", "n_problems", "S_solo", "S_arm", "lift", "rel_lift", "rel_lo", "rel_hi", "rel_halfwidth", "regression_rate", "improvement_rate", "tie_rate", "pair_regress", "pair_improve", "pair_tie", "p_wilcoxon_holm", "p_mcnemar_holm"],
             {c: pct for c in ("rel_lift", "rel_lo", "rel_hi", "rel_halfwidth")})}
<h2>Standing table</h2>
{_table_html(standing, ["arm_kind", "direction", "n_above", "improve_above", "regress_above", "n_tie", "improve_tie", "regress_tie", "n_below", "improve_below", "regress_below", "effect", "effect_lo", "effect_hi"]) if standing.height else "<p>no standing classes (needs R &gt;= 2)</p>"}
{''.join(divs)}
<script type="text/javascript">{''.join(scripts)}</script>
</body></html>"""
    path = out / "report.html"
    path.write_text(doc)
    return path
