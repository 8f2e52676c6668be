"""`mkb-run compact`, `verify` and `schemas`: event-store maintenance commands."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

STORE_HELP = "Dataset URL (local path, s3://..., memory://...); default $MKB_STORE, else events/local under the working directory."


def compact(
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    kind: Optional[list[str]] = typer.Option(None, "--kind", help="Only this kind (repeatable); default every kind in the store."),
    target_rows: int = typer.Option(250_000, "--target-rows", min=2, help="Rows per merged file at most."),
    grace_s: float = typer.Option(300.0, "--grace-s", min=0.0, help="Delete merged sources only once their merged file is this old (readers that listed them finish first)."),
) -> None:
    """Merge small event files into larger ones; readers see the same rows before, during and after.

    Safe to start from any number of hosts at once: each kind is compacted under a lease, and a
    kind another host is compacting is reported and left to it. Killing it at any point is safe.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.table import Table

    from mkb.cli._exit import guard
    from mkb.events._compact import clean_staging, compact_kind
    from mkb.events._schema import schemas
    from mkb.events._store import resolve_store

    console = Console(stderr=True)
    with guard():
        st = resolve_store(store, for_writing=True)
        st.require_exists()
        kinds = kind or st.kinds()
        unknown = [k for k in kinds if k not in schemas()]
        if unknown:
            console.print(f"[yellow]skipping kinds without a schema in this mkb: {unknown}[/]")
            kinds = [k for k in kinds if k not in unknown]
        results = []
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console, transient=True) as progress:
            task = progress.add_task("compacting", total=len(kinds))
            for k in kinds:
                progress.update(task, description=f"compacting {k}")
                try:
                    results.append(compact_kind(k, st, target_rows=target_rows, grace_s=grace_s))
                except Exception:
                    progress.stop()
                    raise
                progress.advance(task)
        stale = clean_staging(st)
    table = Table(title=f"compaction of {st.url}")
    table.add_column("kind", no_wrap=True, min_width=16)
    for col in ("files before", "after", "rows merged", "written", "deleted", "awaiting grace", "duplicates removed", "skipped"):
        table.add_column(col, justify="right")
    for r in results:
        if r.held_by is not None:
            table.add_row(r.kind, "", "", "", "", "", "", "", f"held by {r.held_by.holder}")
            continue
        table.add_row(r.kind, str(r.files_before), str(r.files_after), str(r.rows), str(len(r.written)), str(len(r.deleted)),
                      str(len(r.awaiting_grace)), str(r.healed), str(len(r.skipped)))
    Console().print(table)
    if stale:
        console.print(f"removed {len(stale)} staging files left by killed writers (older than 1 h)")
    for r in results:
        if r.held_by is not None:
            console.print(f"[yellow]{r.kind}: another compaction holds it[/] ({r.held_by.holder}, token {r.held_by.token}); left to it")
        for path, why in r.skipped.items():
            console.print(f"[yellow]left as is[/] {path}: {why}")


def verify(
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    kind: Optional[list[str]] = typer.Option(None, "--kind", help="Only this kind (repeatable); default every kind in the store."),
) -> None:
    """Read every data page of every event file and list the files that cannot be read (exit 1 when there are any)."""
    from mkb.cli._exit import CHECK_FAILED, NO_DATA, guard
    from mkb.events._verify import verify as run_verify

    with guard():
        rep = run_verify(store, kinds=kind)
    for k in rep.unknown_kinds:
        typer.echo(f"kind={k}: no schema in this mkb, not checked", err=True)
    for path, why in sorted(rep.bad.items()):
        typer.echo(f"bad: {path}: {why.splitlines()[0]}")
    typer.echo(f"read {rep.files} files, {rep.rows} rows; {len(rep.bad)} bad")
    if rep.bad:
        typer.echo("hint: move the bad files out of the store (readers already skip them) and re-write their events if you have them", err=True)
        raise typer.Exit(CHECK_FAILED)
    if rep.files == 0:
        raise typer.Exit(NO_DATA)


def schemas_cmd(
    write: bool = typer.Option(False, "--write", help="Write the markdown to --out instead of printing it."),
    out: Path = typer.Option(Path("docs/schemas.md"), "--out", help="Where --write puts the reference."),
    check: bool = typer.Option(False, "--check", help="Exit 1 when --out differs from the schemas (for CI)."),
) -> None:
    """Print (or write) the event-schema reference generated from schemas/*.json."""
    from mkb.events._docs import render_markdown

    text = render_markdown()
    if check:
        current = out.read_text() if out.exists() else ""
        if current != text:
            from mkb.cli._exit import CHECK_FAILED

            typer.echo(f"{out} is out of date\nhint: run `mkb-run schemas --write`", err=True)
            raise typer.Exit(CHECK_FAILED)
        typer.echo(f"{out} is up to date")
        return
    if write:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text, nl=False)


def register(app: typer.Typer) -> None:
    app.command("compact")(compact)
    app.command("schemas")(schemas_cmd)
    app.command("verify")(verify)
