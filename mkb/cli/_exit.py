"""The exit codes both command lines use, and the one place that turns a known failure into a one-line error instead of a traceback."""

from __future__ import annotations

import errno
import sys
from typing import Callable

OK = 0  # done; what was asked for is printed
CHECK_FAILED = 1  # the command ran and its verdict is negative: a kernel failed grading, `verify` found bad files, `schemas --check` found a stale doc
BAD_INPUT = 2  # the request cannot be served as given: a path that does not exist, an unknown kind, a read-only URL to write to, mixed versions without --stratify (click's usage errors are 2 too)
NO_DATA = 3  # the store exists and is readable but holds nothing of what was asked
ERROR = 4  # the environment failed: disk full, store read-only, a key vanished, a file of a newer major version, a lost lease

_OS_HINTS = {
    errno.ENOSPC: "free space on the device that holds the store (or its .staging folder), then run it again; nothing already written is lost",
    errno.EDQUOT: "the disk quota is exhausted; free space or raise the quota, then run it again",
    errno.EROFS: "the store is on a read-only filesystem; run maintenance where it is writable (reading works as is)",
    errno.EACCES: "this user may not write there; run as the store's owner or copy the store",
    errno.EPERM: "this user may not write there; run as the store's owner or copy the store",
    errno.ENOENT: "it vanished while the command ran (another process deleted or compacted it); run the command again",
}


def classify(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, message) for the failures mkb knows how to explain; None for a bug (let its traceback show)."""
    from mkb.events import LeaseLost, NewerSchemaError, SchemaError, StoreError

    if isinstance(exc, NewerSchemaError):
        return ERROR, str(exc)
    if isinstance(exc, (StoreError, SchemaError)):
        return BAD_INPUT, str(exc)
    if isinstance(exc, LeaseLost):
        return ERROR, str(exc)
    if isinstance(exc, OSError):
        where = exc.filename or ""
        what = exc.strerror or str(exc)
        if "\nhint:" in str(exc):
            return ERROR, str(exc) if not where or where in str(exc) else f"{where}: {exc}"
        hint = _OS_HINTS.get(exc.errno or -1)
        return ERROR, f"{where + ': ' if where else ''}{what}" + (f"\nhint: {hint}" if hint else "")
    return None


def fail(code: int, message: str) -> None:
    """Print `error: <message>` on stderr and exit with `code`."""
    import typer

    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def run_cli(app: Callable[[], object]) -> None:
    """Run a Typer app; a known failure becomes one line on stderr and its exit code."""
    try:
        app()
    except SystemExit:
        raise
    except Exception as exc:
        known = classify(exc)
        if known is None:
            raise
        code, message = known
        print(f"error: {message}", file=sys.stderr)
        sys.exit(code)


class guard:
    """`with guard():` around a command's body: a known failure exits with its code and one line (works under CliRunner too)."""

    def __enter__(self) -> "guard":
        return self

    def __exit__(self, typ, exc, tb) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        import click

        if isinstance(exc, (click.exceptions.Exit, click.ClickException)):
            return False
        known = classify(exc)
        if known is None:
            return False
        fail(*known)
        return False
