"""The offline HTML report: small aggregated tables, altair charts inlined, optional PNG/SVG beside it."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from mkb.analysis._stats import BootstrapSpec, contrast_table, lift_table, power_table, standing_table
from mkb.analysis._tables import NOISE_ARM, Tables

# After every chart has rendered, records per chart whether it drew marks and whether its legends fit inside it
# (the headless-browser test reads this; a reader's browser shows nothing of it)
RENDER_CHECK = """
Promise.allSettled(embeds).then(results => {
  const out = {};
  results.forEach((r, i) => {
    const name = r.status === 'fulfilled' ? r.value.view.container().id : 'chart' + i;
    if (r.status !== 'fulfilled') { out[name] = {drawn: false, error: String(r.reason)}; return; }
    const svg = r.value.view.container().querySelector('svg');
    const marks = svg ? svg.querySelectorAll('.role-mark path, .role-mark rect, .role-mark line, .role-mark circle, .role-mark text').length : 0;
    const box = svg ? svg.getBoundingClientRect() : null;
    let fits = true, truncated = false;
    if (svg) svg.querySelectorAll('.role-legend').forEach(g => {
      const b = g.getBoundingClientRect();
      if (b.left < box.left - 1 || b.top < box.top - 1 || b.right > box.right + 1 || b.bottom > box.bottom + 1) fits = false;
      g.querySelectorAll('text').forEach(t => { if (t.textContent.includes('\u2026')) truncated = true; });
    });
    out[name] = {drawn: marks > 0, marks: marks, legends: svg ? svg.querySelectorAll('.role-legend').length : 0,
                 legends_fit: fits && !truncated, width: box ? box.width : 0,
                 fits_page: box ? box.right <= document.body.getBoundingClientRect().right + 1 : false};
  });
  document.getElementById('render-status').textContent = JSON.stringify(out);
});
"""
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
    ).properties(width=300).facet(facet=alt.Facet("direction:N", title=None), columns=2).properties(
        title="Relative lift by model and direction")
    pp = tables.pairs.filter(pl.col("arm_kind") == "transfer").group_by("direction", "problem").agg(
        solo=pl.col("S_solo").mean(), transfer=pl.col("S").mean()).sort("direction", "problem")  # the same file on every run
    slopes = _check(pp.unpivot(index=["direction", "problem"], variable_name="arm", value_name="S")
                    .join(pp.select("direction", "problem", sign=pl.when(pl.col("transfer") > pl.col("solo")).then(pl.lit("up"))
                                    .when(pl.col("transfer") < pl.col("solo")).then(pl.lit("down")).otherwise(pl.lit("flat"))),
                          on=["direction", "problem"], maintain_order="left"), "slopes")
    out["problem_slopes"] = alt.Chart(slopes).mark_line(opacity=0.5, point=True).encode(
        x=alt.X("arm:N", sort=["solo", "transfer"], title=None), y=alt.Y("S:Q", title="mean S over models and replicates"),
        detail="problem:N", color=alt.Color("sign:N", scale=alt.Scale(domain=["up", "flat", "down"], range=["#2a9d8f", "#bbbbbb", "#e76f51"])),
        tooltip=["problem", "arm", "S"],
    ).properties(width=220, height=300).facet(facet=alt.Facet("direction:N", title=None), columns=2).properties(
        title="Per-problem paired slopes: solo -> transfer")
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
        ).properties(width=260, height=240).facet(facet=alt.Facet("direction:N", title=None), columns=2).properties(
            title="Lift against standing, beside the placebo, wrong skill and solo noise floor")
    if family.height:
        fam = _check(family.filter(pl.col("arm_kind") == "transfer").select(
            "family", cell=pl.format("{} {}", "model", "direction"), rel=pl.col("rel_lift") * 100), "family")
        out["family_heatmap"] = alt.Chart(fam).mark_rect().encode(
            x=alt.X("cell:N", title=None), y=alt.Y("family:N"),
            color=alt.Color("rel:Q", title="rel. lift %", scale=alt.Scale(scheme="redblue", domainMid=0)),
            tooltip=["family", "cell", "rel"]).properties(title="Transfer relative lift by family")
    # legends below each chart, never truncated (labelLimit 0), titles unclipped: they fit the chart's width
    return {k: c.configure_legend(orient="bottom", labelLimit=0, titleLimit=0, columns=3).configure_view(strokeWidth=0)
            for k, c in out.items()}


def _pct(v) -> str:
    return "n/a" if v is None else f"{100 * v:+.1f}%"


def _share(v) -> str:
    return "n/a" if v is None else f"{100 * v:.0f}%"


def headline(lift: pl.DataFrame, contrast: pl.DataFrame, standing: pl.DataFrame, power: pl.DataFrame) -> str:
    """The report's opening: per cell the relative lift with its CI, the regression rate beside its noise floor,
    the standing effect beside the solo noise floor's, and what the data cannot detect."""
    e = html.escape
    tr = lift.filter(pl.col("arm_kind") == "transfer")
    rows = []
    for r in tr.iter_rows(named=True):
        c = contrast.filter((pl.col("contrast") == "transfer - placebo") & (pl.col("model") == r["model"])
                            & (pl.col("direction") == r["direction"])) if contrast.height else contrast
        cr = c.row(0, named=True) if c.height else None
        rows.append(
            f"<tr><td>{e(r['model'])}</td><td>{e(r['direction'])}</td>"
            f"<td><b>{_pct(r['rel_lift'])}</b> [{_pct(r['rel_lo'])}, {_pct(r['rel_hi'])}]</td>"
            f"<td>{_pct(cr['rel_diff']) if cr else 'n/a'} [{_pct(cr['rel_lo']) if cr else ''}, {_pct(cr['rel_hi']) if cr else ''}]</td>"
            f"<td>{_share(r['regression_rate'])} [{_share(r['regression_rate_lo'])}, {_share(r['regression_rate_hi'])}]"
            f" vs noise floor {_share(r['regression_noise_floor'])}</td>"
            f"<td>{'yes' if r['detects_10pct'] else '<b>no</b>'}</td></tr>")
    table = ("<table class='headline'><thead><tr><th>model</th><th>direction</th><th>relative lift vs solo [95% CI]</th>"
             "<th>transfer - placebo, time-matched [95% CI]</th><th>regression rate [95% CI] vs its noise floor</th>"
             "<th>could detect a 10% lift (80% power)</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    st = ""
    if standing.height:
        def eff(arm):
            x = standing.filter((pl.col("arm_kind") == arm) & (pl.col("direction") == "pooled"))
            if not x.height:
                return "n/a"
            r = x.row(0, named=True)
            return (f"{r['effect']:+.3f} [{r['effect_lo']:+.3f}, {r['effect_hi']:+.3f}] "
                    f"({r['effect_S']:+.2f} S points)" if r["effect"] is not None else "n/a")
        st = (f"<p>Standing effect of the transfer arm (pooled over models and directions): <b>{eff('transfer')}</b>; "
              f"placebo {eff('placebo')}; solo noise floor {eff('solo_noise')}. A standing effect is read against these two.</p>")
    under = power.filter(pl.col("arm_kind") == "transfer").filter(pl.col("power_at_target").fill_null(0) < 0.8) if power.height else power
    if under.height:
        need = ", ".join(f"{r['model']} {r['direction']}: {r['problems_needed']} problems or "
                         f"{r['replicates_needed'] if r['replicates_needed'] is not None else 'no number of'} replicates"
                         for r in under.iter_rows(named=True))
        cannot = (f"<p><b>What this data cannot detect:</b> {under.height} transfer cell(s) have under 80% power for a 10% "
                  f"relative lift (needed at 80%: {e(need)}).</p>")
    else:
        cannot = "<p>Every transfer cell has at least 80% power to detect a 10% relative lift.</p>"
    return f"<section id='headline'><h2>Headline</h2>{table}{st}{cannot}</section>"


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


@dataclass(frozen=True)
class ReportFiles:
    """What `write_report` wrote: the page, and every file it wrote beside it (chart specs and images, table CSVs)."""

    html: Path
    files: tuple[Path, ...]


def write_report(tables: Tables, out_dir: str | Path, *, spec: BootstrapSpec = BootstrapSpec(),
                 formats: tuple[str, ...] = ()) -> ReportFiles:
    """Write report.html (self-contained: the Vega bundle is inlined once) plus each chart's data as CSV,
    its Vega-Lite JSON, and PNG/SVG when asked."""
    from altair.utils._importers import import_vl_convert
    from altair.utils.html import vl_version_for_vl_convert

    from dataclasses import replace

    from mkb.analysis._tables import _text

    tables = replace(tables, pairs=_text(tables.pairs))  # the charts' data as text, whichever pairs were read
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lift_all = lift_table(tables.pairs, spec=spec, pooled=True)
    lift = lift_all.filter(pl.col("direction") != "pooled")
    fam = lift_table(tables.pairs, by=("family",), spec=spec, tests=False)
    standing_all = standing_table(tables.pairs, spec=spec, over_directions=True)
    standing = standing_all.filter(pl.col("direction") != "pooled") if standing_all.height else standing_all
    contrast = contrast_table(tables.pairs, spec=spec)
    power = power_table(lift, tables.pairs)
    ch = charts(tables, lift, standing, fam)
    vlc = import_vl_convert()
    bundle = vlc.javascript_bundle(vl_version=vl_version_for_vl_convert())
    divs, scripts, written = [], [], []
    for name, chart in ch.items():
        spec_json = chart.to_dict()
        (out / f"{name}.vl.json").write_text(json.dumps(spec_json))
        written.append(out / f"{name}.vl.json")
        for f in formats:
            chart.save(str(out / f"{name}.{f}"))
            written.append(out / f"{name}.{f}")
        divs.append(f'<h2>{html.escape(name.replace("_", " "))}</h2><div id="{name}"></div>')
        scripts.append(f"embeds.push(vegaEmbed('#{name}', {json.dumps(spec_json)}, {{actions: false, renderer: 'svg'}}));")
    flat = lambda df: df.select([c for c, t in df.schema.items() if not isinstance(t, (pl.List, pl.Struct))])  # noqa: E731
    for name, df in (("lift", flat(lift_all)), ("contrast", contrast), ("standing", standing_all)):
        if df.height:
            df.write_csv(out / f"{name}.csv")
            written.append(out / f"{name}.csv")
    s = tables.summary()
    pct = lambda v: f"{100 * v:+.1f}%"  # noqa: E731
    under = lift.filter(~pl.col("detects_10pct").fill_null(False))
    doc = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>mkb report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}} table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}} th{{background:#f4f4f4}}</style>
<script type="text/javascript">{bundle}</script></head><body>
<h1>MetaKernelBench analysis</h1>
{headline(lift_all, contrast, standing_all, power)}
<p>store: <code>{html.escape(tables.store)}</code>; attempts {s['attempts']}, counted {s['included']};
excluded: infra_error {s['infra_error']}, unfinished {s['unfinished']}, annotated {s['annotated']}, ungraded {s['ungraded']}.
{'<b>Stratified by version</b>.' if tables.stratified else ''}</p>
<p>{html.escape(tables.verdict_note())}.</p>
<p>{html.escape(tables.score_note())}: every S, lift and speedup below is read against that baseline.</p>
<p>{html.escape(spec.describe())}. A cell whose relative-lift 95% CI half-width exceeds 7 points has under 80% power for a 10% lift:
{under.height} of {lift.height} cells ({html.escape(', '.join(f"{r['model']} {r['arm_kind']} {r['direction']}" for r in under.iter_rows(named=True))[:2000])}).</p>
<h2>Lift table</h2>
{_table_html(lift, ["model", "arm_kind", "direction", "n_pairs", "n_problems", "S_solo", "S_arm", "lift", "rel_lift", "rel_lo", "rel_hi", "rel_halfwidth", "regression_rate", "improvement_rate", "tie_rate", "pair_regress", "pair_improve", "pair_tie", "p_wilcoxon_holm", "p_mcnemar_holm", "p_pass_clustered_holm"],
             {c: pct for c in ("rel_lift", "rel_lo", "rel_hi", "rel_halfwidth")})}
<h2>Standing table</h2>
{_table_html(standing, ["arm_kind", "direction", "n_above", "improve_above", "regress_above", "n_tie", "improve_tie", "regress_tie", "n_below", "improve_below", "regress_below", "effect", "effect_lo", "effect_hi"]) if standing.height else "<p>no standing classes (needs R &gt;= 2)</p>"}
{''.join(divs)}
<pre id="render-status" style="display:none"></pre>
<script type="text/javascript">const embeds = [];
{''.join(scripts)}
{RENDER_CHECK}</script>
</body></html>"""
    path = out / "report.html"
    path.write_text(doc)
    return ReportFiles(path, tuple(written))
