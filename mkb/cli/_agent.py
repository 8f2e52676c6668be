"""`mkb-run attempt`, `mkb-run submit`, `mkb-run docpack`: one agent attempt end to end, a harness's submit, the DSL doc packs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

STORE_HELP = "Dataset URL the events go to; default $MKB_STORE, else events/local under the working directory."


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def attempt_cmd(
    problem: int = typer.Option(..., "--problem", help="Problem number."),
    dsl: str = typer.Option(..., "--dsl", help="Target DSL (cute, tirx)."),
    model: str = typer.Option("scripted", "--model", help="litellm model string, e.g. openai/gpt-5, anthropic/claude-sonnet-4-5, hosted_vllm/Qwen/Qwen3-32B."),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="OpenAI-compatible endpoint (vLLM, SGLang, a proxy)."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="Name of the environment variable holding the API key (the key is never recorded)."),
    script: Optional[Path] = typer.Option(None, "--script", help="Run the scripted model from this JSON script (tests, demos)."),
    arm: str = typer.Option("solo", "--arm", help="solo, transfer, placebo, same or wrong."),
    skill: Optional[Path] = typer.Option(None, "--skill", help="SKILL.md given to a non-solo arm (an empty file gives an empty slot)."),
    source_dsl: Optional[str] = typer.Option(None, "--source-dsl", help="DSL the skill came from."),
    skill_source: Optional[str] = typer.Option(None, "--skill-source", help="attempt_id the skill came from."),
    header: str = typer.Option("neutral", "--header", help="neutral (one header for every arm) or upstream (replication)."),
    submissions: int = typer.Option(10, "--submissions"),
    turns: int = typer.Option(80, "--turns"),
    output_tokens: int = typer.Option(300_000, "--output-tokens"),
    upstream_wall_clock: bool = typer.Option(False, "--upstream-wall-clock", help="Binding 2400 s wall clock (upstream's preset; recorded)."),
    temperature: float = typer.Option(1.0, "--temperature"),
    reasoning_effort: Optional[str] = typer.Option(None, "--reasoning-effort"),
    experiment: str = typer.Option("adhoc", "--experiment"),
    replicate: int = typer.Option(0, "--replicate"),
    workspace: Optional[Path] = typer.Option(None, "--workspace", help="Fresh folder for the attempt (default runs/<attempt_id>/workspace)."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    grader: str = typer.Option("local", "--grader", help="local (this machine's GPU through mkb.grader)."),
    unsafe_no_sandbox: bool = typer.Option(False, "--unsafe-no-sandbox", help="Run bash/check without bubblewrap (recorded; reported apart)."),
) -> None:
    """Run ONE attempt end to end: workspace, model loop, submissions to the grader, events; prints a live progress line."""
    from rich.console import Console
    from rich.live import Live

    from mkb.agent import AttemptSpec, Budget, ModelConfig, SkillSlot, run_attempt
    from mkb.agent._loop import BuiltinAgent
    from mkb.agent._sandbox import SandboxUnavailable, probe
    from mkb.events import EventWriter, uuid7

    if arm != "solo" and skill is None:
        _fail(f"--arm {arm} needs --skill FILE\nhint: an empty file gives an empty (flagged) slot")
    if skill is not None and not skill.is_file():
        _fail(f"{skill}: no such file")
    if not unsafe_no_sandbox and (why := probe()):
        _fail(f"attempt not started: {why}")
    slot = SkillSlot.of(skill.read_text(), source_attempt=skill_source) if skill is not None and arm != "solo" else None
    budget = Budget(submissions=submissions, turns=turns, output_tokens=output_tokens, wall_clock_s=2400.0 if upstream_wall_clock else None)
    attempt_id = uuid7()
    ws = workspace or Path("runs") / attempt_id / "workspace"
    console = Console(stderr=True)
    server = None
    if script is not None:
        from mkb.agent._scripted import ScriptedModel

        try:
            server = ScriptedModel(script).start()
        except (OSError, ValueError) as exc:
            _fail(f"{script}: {exc}")
        model_cfg = ModelConfig(name="openai/scripted", api_base=server.api_base, scripted=True, temperature=temperature)
    else:
        if model == "scripted":
            _fail("--model scripted needs --script FILE\nhint: or pass a litellm model string and --api-key-env")
        import os

        if api_key_env and not os.environ.get(api_key_env):
            _fail(f"environment variable {api_key_env} is not set (it should hold the API key)\nhint: export {api_key_env}=...")
        model_cfg = ModelConfig(name=model, api_base=api_base, api_key_env=api_key_env, temperature=temperature, reasoning_effort=reasoning_effort)
    try:
        spec = AttemptSpec(experiment=experiment, problem=problem, target_dsl=dsl, arm_kind=arm, replicate=replicate,
                           source_dsl=source_dsl if arm != "solo" else None, skill=slot, model=model_cfg, budget=budget, attempt_id=attempt_id,
                           header=header, unsafe_no_sandbox=unsafe_no_sandbox, gpu=_gpu_name())
    except ValueError as exc:
        _fail(str(exc))
    writer = EventWriter(store)
    g = _make_grader(grader, writer)
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        agent = BuiltinAgent(progress=lambda c, b: live.update(c.line(b)))
        try:
            res = run_attempt(spec, workspace=ws, grader=g, writer=writer, agent=agent)
        except (SandboxUnavailable, FileExistsError, ValueError) as exc:
            _fail(str(exc))
        finally:
            writer.close()
            if server is not None:
                server.stop()
            close = getattr(g, "close", None)
            if close:
                close()
    print(json.dumps({"attempt_id": res.attempt_id, "stop_reason": res.stop_reason, "submissions": res.submissions, "turns": res.turns,
                      "output_tokens": res.output_tokens, "cost_usd": res.cost_usd, "final_kernel_sha256": res.final_kernel_sha256,
                      "skill_flags": list(res.skill_flags), "workspace": str(ws), "error": res.error}, indent=1))
    if res.error:
        typer.echo(f"error: attempt {res.attempt_id} stopped ({res.stop_reason}): {res.error}", err=True)
    raise typer.Exit(1 if res.stop_reason == "infra_error" else 0)


def _gpu_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except Exception:  # noqa: BLE001
        return "unknown"


def _make_grader(kind: str, writer):
    from mkb.grader import GradingQueue

    if kind != "local":
        _fail(f"unknown --grader {kind!r}\nhint: local")
    return GradingQueue(writer=writer)


def replay_cmd(
    attempt_id: str = typer.Argument(..., help="The recorded attempt to replay."),
    source: str = typer.Option(..., "--from", help="Store holding the recorded attempt (and its skill's source attempt)."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    workspace: Optional[Path] = typer.Option(None, "--workspace"),
) -> None:
    """Replay a recorded attempt: its model replies from the events, tools, sandbox and grader run again for real."""
    from rich.console import Console
    from rich.live import Live

    from mkb.agent._replay import ReplayError, replay_attempt
    from mkb.agent._sandbox import SandboxUnavailable
    from mkb.events import EventWriter, uuid7

    ws = workspace or Path("runs") / f"replay-{uuid7()}" / "workspace"
    writer = EventWriter(store)
    g = _make_grader("local", writer)
    try:
        with Live(console=Console(stderr=True), refresh_per_second=4) as live:
            res = replay_attempt(source, attempt_id, workspace=ws, grader=g, writer=writer, progress=lambda c, b: live.update(c.line(b)))
    except (ReplayError, SandboxUnavailable, FileExistsError) as exc:
        _fail(str(exc))
    finally:
        writer.close()
        close = getattr(g, "close", None)
        if close:
            close()
    print(json.dumps({"attempt_id": res.attempt_id, "replay_of": attempt_id, "stop_reason": res.stop_reason, "submissions": res.submissions,
                      "final_kernel_sha256": res.final_kernel_sha256}, indent=1))


def submit_cmd() -> None:
    """Inside an external harness's workspace: grade kernel.py through the adapter that started the harness (uses one submission)."""
    from mkb.agent._external import client_submit

    code, text = client_submit(Path.cwd())
    print(text)
    raise typer.Exit(code)


def docpack_cmd(
    dsl: Optional[str] = typer.Option(None, "--dsl", help="One DSL (default: every DSL)."),
    check: bool = typer.Option(False, "--check", help="Exit 1 when a committed API.md differs from what the installed DSL generates."),
) -> None:
    """Build each DSL's doc pack: the primer plus API.md generated from the installed DSL version; print its version."""
    from mkb.agent._docpack import build_api_reference
    from mkb.dsl import dsl_names

    stale = []
    for name in [dsl] if dsl else list(dsl_names()):
        try:
            changed, path, version = build_api_reference(name, write=not check)
        except (ImportError, FileNotFoundError, ValueError) as exc:
            _fail(f"doc pack {name}: {exc}")
        print(f"{name}: {path} ({'stale' if changed and check else 'written' if changed else 'up to date'}); doc pack version {version[:16]}")
        if changed and check:
            stale.append(name)
    if stale:
        typer.echo(f"stale doc packs: {', '.join(stale)}\nhint: run `mkb-run docpack`", err=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("attempt")(attempt_cmd)
    app.command("submit")(submit_cmd)
    app.command("replay")(replay_cmd)
    app.command("docpack")(docpack_cmd)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(0)
