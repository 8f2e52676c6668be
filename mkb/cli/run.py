"""`mkb-run`: the run side's command line (plan, run, grade, problems, store maintenance)."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="mkb-run",
    help=(
        "Run MetaKernelBench: list and characterise problems, grade kernels, run experiments, maintain the event store."
    ),
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

# Sub-command modules register themselves here (one module per command group, to keep this file thin).
_COMMAND_MODULES = ("mkb.cli._store", "mkb.cli._problems", "mkb.cli._grade", "mkb.cli._agent", "mkb.cli._experiment")


def _register() -> None:
    import importlib

    for name in _COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        mod.register(app)


_register()


def main() -> None:
    from mkb.cli._exit import run_cli

    run_cli(app)


if __name__ == "__main__":
    main()
