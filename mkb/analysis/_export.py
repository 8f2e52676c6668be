"""Exports a store as a Hugging Face dataset folder (data per kind + a card documenting the schema) and CSVs."""

from __future__ import annotations

import polars as pl

from mkb.events import read, schemas


def _card(kinds: dict[str, int], store_url: str, score_note: str | None = None) -> str:
    import mkb

    yaml = ["---", "configs:"]
    for k in kinds:
        yaml += [f"- config_name: {k}", "  data_files:", "  - split: train", f"    path: data/{k}/*.parquet"]
    yaml += ["---", ""]
    lines = [
        "# MetaKernelBench events", "",
        f"Exported by mkb {mkb.__version__} (`mkb-analyze export`) from `{store_url}`. Each config is one event kind; "
        "rows keep their `event_id` (uuid7), `schema_version` and the envelope columns, so the dataset can be "
        "re-analysed with `mkb-analyze --store hf://datasets/<repo>`. Derived tables (attempts, pairs, lift, "
        "standing) are in `derived/` as CSV.", "",
        "Definitions (DESIGN.md): speedup = median eager time / median candidate time; R@t = passed and speedup >= t; "
        "S = 100 x mean over t in {0, 0.5, 1, 2, 4} of R@t; lift = S(arm) - S(solo of the target DSL), same model, "
        "problem and replicate. S_upstream: the same ladder on speedup_upstream = reference_median_us / candidate_median_us "
        "(the problem's fp32 reference timed as upstream MetaKernelBench times it; verdict `s_upstream`)."
        + (f" Derived tables: {score_note}." if score_note else ""), "",
        "| config | rows |", "|---|---|", *[f"| {k} | {n} |" for k, n in kinds.items()], "",
    ]
    sch = schemas()
    for k in kinds:
        s = sch[k]
        lines += [f"## `{k}` (schema {s.version})", "", s.doc, "", "| column | type | nullable | description |", "|---|---|---|---|"]
        lines += [f"| `{c.name}` | {c.type} | {'yes' if c.nullable else 'no'} | {c.doc.replace('|', '/')} |" for c in s.columns]
        lines.append("")
    return "\n".join(yaml + lines)


def export_dataset(store: str, out: str, *, tables=None, redact: bool = False) -> dict[str, int]:
    """Write `out/data/<kind>/events.parquet` per kind, `out/README.md` and `out/derived/*.csv`; returns rows per kind.

    `redact` replaces message and code text by its byte count (mkb.analysis._transcript.redact_frame).
    """
    import fsspec  # here, not at import: every command imports mkb.analysis, and a local read needs no fsspec (_store._LocalFS)

    fs, root = fsspec.core.url_to_fs(out)
    kinds: dict[str, int] = {}
    for kind in sorted(schemas()):
        df = read(kind, store)
        if df.height == 0:
            continue
        kinds[kind] = df.height
        if redact:
            from mkb.analysis._transcript import redact_frame

            df = redact_frame(kind, df)
        fs.makedirs(f"{root}/data/{kind}", exist_ok=True)
        with fs.open(f"{root}/data/{kind}/events.parquet", "wb") as f:
            df.sort("ts").write_parquet(f, compression="zstd")
    with fs.open(f"{root}/README.md", "w") as f:
        f.write(_card(kinds, store, tables.score_note() if tables is not None else None))
    if tables is not None:
        from mkb.analysis._stats import lift_table, standing_table

        fs.makedirs(f"{root}/derived", exist_ok=True)
        derived = {"attempts": tables.attempts, "pairs": tables.pairs}
        if tables.pairs.height:
            derived["lift"] = lift_table(tables.pairs)
            derived["standing"] = standing_table(tables.pairs)
        for name, df in derived.items():
            if df.height == 0:
                continue
            flat = df.select([c for c, t in df.schema.items() if not isinstance(t, (pl.List, pl.Struct))])
            with fs.open(f"{root}/derived/{name}.csv", "w") as f:
                flat.write_csv(f)
    return kinds


CHAR_COLS = ("problem", "problem_name", "family", "problem_hash", "size", "gpu", "ok", "eager_median_us", "peak_memory_bytes",
             "fp64_gap", "sol_us", "sol_ratio", "within_band", "error")


def problems_table(store: str) -> pl.DataFrame:
    """The characterisation summary: one row per (problem, size, gpu), the latest measurement, with torch.compile
    beside it (the speed a user gets without an agent; mkb.analysis._compile) where the store measured it for the
    same problem hash and GPU model. A problem with torch.compile rows but no characterisation still gets a row."""
    from mkb.analysis._compile import MODE_KEYS, compile_times, machine_expr

    c = read("characterisation", store)
    tc = read("torch_compile", store)
    ct = compile_times(tc)
    if c.height == 0 and ct.height == 0:
        return c

    c = c.with_columns(machine=machine_expr(gpu_model="gpu_model" if "gpu_model" in c.columns else None))
    # the latest problem version per (problem, size, machine), whichever kind measured it last: a store that holds
    # rows of an earlier version of a problem (its hash changed) shows only the current one, like the characterisation
    keys = ["problem", "problem_hash", "size", "machine"]
    seen = [c.select(*keys, "ts")] if c.height else []
    if tc.height:
        seen.append(tc.select("problem", "problem_hash", "size", machine=machine_expr(), ts="ts"))
    latest = (pl.concat([f.with_columns(pl.col("problem").cast(pl.Int64)) for f in seen], how="vertical_relaxed")
              .sort("ts").unique(subset=["problem", "size", "machine"], keep="last").select(keys))
    c = (c.join(latest, on=keys, how="semi") if c.height else c).sort("ts") \
        .unique(subset=["problem", "size", "gpu"], keep="last").select(*CHAR_COLS, "machine")
    ct = ct.join(latest, on=keys, how="semi") if ct.height else ct
    out = c.join(ct, on=keys, how="full", coalesce=True)
    out = out.with_columns(gpu=pl.coalesce("gpu", "machine"), problem_name=pl.coalesce("problem_name", "problem_name_right"),
                           family=pl.coalesce("family", "family_right"),
                           speedup_compile_vs_eager=pl.col("compile_speedup_over_eager"))
    cols = [*CHAR_COLS, "compile_us", "compile_mode", "speedup_compile_vs_eager",
            *[f"{k}_{x}" for k in MODE_KEYS.values() for x in ("status", "us", "compile_s", "error_class")]]
    # a problem can still hold two rows of one size and GPU name (a torch.compile row whose machine key is the driver's
    # name, not the model the characterisation's is mapped to): the hash and machine break the tie, one order every run
    return out.sort("problem", "size", "gpu", "problem_hash", "machine", nulls_last=True).select(cols)



def verdicts_table(store: str) -> pl.DataFrame:
    """Every verdict in a store with no attempts behind it (stand-alone gradings, red-team runs), oldest first.

    Grader datasets have no coordinates to pair, but a reader still wants to see what was graded and how.
    """
    v = read("verdict", store)
    if v.height == 0:
        return v
    return v.sort("ts").select("ts", "scope", "problem", "dsl", "passed", "reason", "speedup", "candidate_median_us",
                               "eager_median_us", "s", "gpu", "kernel_sha256")
