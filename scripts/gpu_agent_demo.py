"""The agent's H200 demo: the scripted model runs solo -> skill -> transfer on problem 28 in both directions through the real grader.

The scripted model is served in this process on 127.0.0.1 and called through litellm as an ordinary
OpenAI-compatible endpoint (the real request path). Its kernels are the committed baselines; its first
submission of every attempt is wrong on purpose (the kernel is given `x` where it should read
`residual`), so each attempt shows a failed verdict, a fix and a passing one. Attempts, in order:
solo cute, solo tirx, transfer tirx (the skill of solo cute), transfer cute (the skill of solo tirx).

On the GPU host (no litellm there): ship the wheels of litellm==1.110.1 and its dependencies, e.g.
    pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
        --platform manylinux2014_x86_64 litellm==1.110.1 -d wheels/litellm
    pip install --no-index --find-links wheels/litellm litellm==1.110.1      # on the host
Run (about 2-4 minutes; most of it worker start-up and 8 gradings):
    python3 scripts/gpu_agent_demo.py --out $OUT 2>&1 | tee $OUT/log
$OUT gets: log (from tee), events.tar.gz (the store: kind=<kind>/*.parquet), summary.json, workspaces.tar.gz
(the four workspaces: kernel.py, SKILL.md, problem/, docs/). Commit as events/h200-agent-demo/ (the
unpacked store) with logs/ (log, summary.json) and a README. Without bubblewrap on the host the
attempts run with --unsafe-no-sandbox, which their events record (the model is scripted).
`--fake-grader` runs the same flow on a CPU with a grader that passes any kernel that reads `residual`
(the CPU test of this script).
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import time
from concurrent.futures import Future
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROBLEM = 28
SKILLS = {
    "cute": ("Fusing the residual add into the normalisation pass means each row is read once: one thread block per row, "
             "128-bit vector loads, a warp-level reduction of the sum of squares followed by a cross-warp reduction, then the "
             "scale and weight multiply on the same registers. The first version read the wrong input for the residual: "
             "correctness failed with a large error, so check which tensor feeds which operand before tuning."),
    "tirx": ("One block per row with vectorised loads and a block-wide sum-of-squares reduction kept the fused add and "
             "normalisation memory bound at close to one read and one write per element. Reading the wrong input for the "
             "residual gave a large correctness error on the first try; matching operands to the reference fixed it."),
}


def baseline(dsl: str) -> str:
    return next(ROOT.glob(f"problems/mlp_norm/{PROBLEM}_*/{dsl}.py")).read_text()


def wrong_on_purpose(source: str) -> str:
    """The baseline with the residual operand replaced by x: compiles and runs, computes the wrong values."""
    out = source.replace("g(residual)", "g(x)", 1).replace("residual.contiguous()", "x.contiguous()", 1)
    if out == source:
        raise SystemExit("error: could not make the wrong-on-purpose kernel (the baseline changed)\nhint: update wrong_on_purpose()")
    return out


def script(dsl: str, *, check: bool = True) -> list[dict]:
    def w(path, content):
        return {"name": "write_file", "arguments": {"path": path, "content": content}}

    good, wrong = baseline(dsl), wrong_on_purpose(baseline(dsl))
    return [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "problem/TASK.md", "limit": 40}}], "reasoning": "Read the task first."},
        {"tool_calls": [w("kernel.py", wrong)] + ([{"name": "check", "arguments": {}}] if check else [])},
        {"tool_calls": [{"name": "submit", "arguments": {}}]},
        {"branch": [{"contains": "passed: false", "then": {"tool_calls": [w("kernel.py", good), {"name": "submit", "arguments": {}}],
                                                           "reasoning": "The verdict says the values are wrong: the residual operand."}}],
         "else": {"tool_calls": [{"name": "finish", "arguments": {}}]}},
        {"tool_calls": [w("SKILL.md", SKILLS[dsl])]},
        {"tool_calls": [{"name": "finish", "arguments": {}}]},
        {"tool_calls": [w("SKILL.md", SKILLS[dsl])]},  # the closing turn
    ]


class FakeGrader:
    """CPU stand-in: passes a kernel that reads `residual`, fails the wrong-on-purpose one (the script's logic test)."""

    def __init__(self) -> None:
        self.n = 0

    def submit(self, job) -> Future:
        from mkb.grader import Verdict

        self.n += 1
        src = Path(job.kernel_path).read_text()
        ok = "g(residual)" in src or "residual.contiguous()" in src
        f: Future = Future()
        f.set_result(Verdict(f"fake-{self.n}", job.problem, job.dsl, "x", ok, None if ok else "verification_mismatch", 1.2 if ok else None,
                             10.0, 8.3 if ok else None, "fake"))
        return f


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fake-grader", action="store_true")
    ap.add_argument("--no-check", action="store_true", help="Leave out the free CPU check call (the CPU test of the flow).")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="mkb-agent-demo-"))  # $OUT gets only the tarballs and the summary
    store = scratch / "store"
    runs = scratch / "runs"

    from mkb.agent import AttemptSpec, Budget, ModelConfig, SkillSlot, run_attempt
    from mkb.agent._loop import BuiltinAgent
    from mkb.agent._sandbox import probe
    from mkb.agent._scripted import ScriptedModel
    from mkb.events import EventWriter

    why = probe()
    unsafe = why is not None
    print(f"sandbox: {'bubblewrap' if not unsafe else 'none (' + why.splitlines()[0] + '): --unsafe-no-sandbox, recorded'}", flush=True)
    gpu = "fake" if args.fake_grader else __import__("torch").cuda.get_device_name(0)
    writer = EventWriter(str(store))
    if args.fake_grader:
        grader = FakeGrader()
    else:
        from mkb.grader import GradingQueue

        grader = GradingQueue(writer=writer)
    summary: dict = {"gpu": gpu, "attempts": []}
    results = {}
    plan = [("solo", "cute", None), ("solo", "tirx", None), ("transfer", "tirx", "cute"), ("transfer", "cute", "tirx")]
    try:
        for arm, dsl, source in plan:
            with ScriptedModel(script(dsl, check=not args.no_check)) as server:
                model = ModelConfig(name="openai/scripted", api_base=server.api_base, scripted=True, request_timeout_s=120)
                slot = None
                if arm != "solo":
                    src = results[("solo", source)]
                    slot = SkillSlot.of(src.skill_text, source_attempt=src.attempt_id)
                spec = AttemptSpec(experiment="h200-agent-demo", problem=PROBLEM, target_dsl=dsl, arm_kind=arm, replicate=0, source_dsl=source,
                                   skill=slot, model=model, budget=Budget(submissions=4, turns=12, output_tokens=100_000), gpu=gpu,
                                   unsafe_no_sandbox=unsafe)
                t0 = time.monotonic()
                agent = BuiltinAgent(progress=lambda c, b: print(f"  {arm} {dsl}: {c.line(b)}", flush=True))
                res = run_attempt(spec, workspace=runs / f"{arm}_{dsl}" / "workspace", grader=grader, writer=writer, agent=agent)
                results[(arm, dsl)] = res
                row = {"arm": arm, "dsl": dsl, "source_dsl": source, "attempt_id": res.attempt_id, "stop_reason": res.stop_reason,
                       "submissions": res.submissions, "turns": res.turns, "best": res.best_verdict, "skill_sha256": res.skill_sha256,
                       "skill_flags": list(res.skill_flags), "seconds": round(time.monotonic() - t0, 1)}
                summary["attempts"].append(row)
                print(json.dumps(row), flush=True)
    finally:
        writer.close()
        close = getattr(grader, "close", None)
        if close:
            close()
    from mkb.events import read

    def rows(kind):
        try:
            return read(kind, str(store))
        except Exception:  # noqa: BLE001 - a kind with no file yet (the fake grader writes no verdicts)
            return None

    counts = {k: (rows(k).height if rows(k) is not None else 0) for k in ("attempt_started", "turn", "tool_call", "submission", "verdict", "skill", "attempt_finished")}
    verdicts = rows("verdict")
    summary["event_counts"] = counts
    summary["seconds"] = round(time.monotonic() - t_start, 1)
    ok = (all(a["stop_reason"] == "finished" and a["submissions"] == 2 and a["best"]["passed"] for a in summary["attempts"])
          and counts["turn"] > 0 and counts["tool_call"] > 0)
    if not args.fake_grader:
        summary["verdicts"] = verdicts.select("dsl", "passed", "reason", "speedup").to_dicts() if verdicts is not None else []
        ok = ok and verdicts is not None and verdicts.height == 8 and sum(verdicts["passed"].to_list()) == 4
    summary["ok"] = ok
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    from mkb.events import pack_dataset
    pack_dataset(store, out / "events.tar.gz", arcname="events")
    with tarfile.open(out / "workspaces.tar.gz", "w:gz") as t:
        for ws in sorted(runs.glob("*/workspace")):
            t.add(ws, arcname=ws.parent.name)
    print(f"{'OK' if ok else 'FAILED'}: {len(summary['attempts'])} attempts, events {counts}, {summary['seconds']} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
