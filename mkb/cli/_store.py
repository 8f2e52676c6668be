"""`mkb-run compact` and `mkb-run schemas`: event-store maintenance commands."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

STORE_HELP = "Dataset URL (local path, s3://..., memory://...); default $MKB_STORE, else events/local under the working directory."


def compact(
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    kind: Optional[list[str]] = typer.Option(None, "--kind", help="Only this kind (repeatable); default every kind in the store."),
    target_rows: int = typer.Option(250_000, "--target-rows", min=2, help="Rows per merged file at most."),
) -> None:
    """Merge small event files into larger ones; readers see the same rows before, during and after.

    A scan that listed the files before the sources were deleted fails when it reads them (it
    never returns wrong rows); run it again. Killing the compaction at any point is safe.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.table import Table

    from mkb.events._compact import clean_staging, compact_kind
    from mkb.events._schema import schemas
    from mkb.events._store import resolve_store

    from mkb.events._schema import SchemaError
    from mkb.events._store import StoreError

    console = Console(stderr=True)
    try:
        st = resolve_store(store, for_writing=True)
    except StoreError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
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
                results.append(compact_kind(k, st, target_rows=target_rows))
            except SchemaError as exc:  # e.g. a file of a newer major version: refuse to rewrite what we cannot read
                progress.stop()
                console.print(f"[red]error:[/] {k}: {exc}")
                raise typer.Exit(1) from None
            progress.advance(task)
    table = Table(title=f"compaction of {st.url}")
    table.add_column("kind", no_wrap=True, min_width=16)
    for col in ("files before", "after", "rows merged", "written", "deleted", "skipped"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r.kind, str(r.files_before), str(r.files_after), str(r.rows), str(len(r.written)), str(len(r.deleted)), str(len(r.skipped)))
    Console().print(table)
    stale = clean_staging(st)
    if stale:
        console.print(f"removed {len(stale)} staging files left by killed writers (older than 1 h)")
    for r in results:
        for path, why in r.skipped.items():
            console.print(f"[yellow]left as is[/] {path}: {why}")


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
            typer.echo(f"{out} is out of date\nhint: run `mkb-run schemas --write`", err=True)
            raise typer.Exit(1)
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
