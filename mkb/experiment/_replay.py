"""A grader that replays verdicts recorded on a GPU for known kernels (by problem hash and kernel sha256), for GPU-less demos.

It never grades: a kernel it has no recorded verdict for is an error, a problem whose hash changed since the
recording is an error, and every verdict it writes says `grader=replay` and names the recorded evaluation.
An index (`replay.json` in the replay dataset folder) lists, for each kernel, the recorded verdict it replays;
the verdict events themselves stay in the dataset they were recorded in.
"""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INDEX = "replay.json"


class ReplayError(LookupError):
    """The replay grader cannot answer: an unknown kernel, a changed problem, or a missing recording."""


@dataclass(frozen=True)
class Recorded:
    problem: int
    problem_hash: str
    dsl: str
    kernel_sha256: str
    evaluation_id: str
    row: dict[str, Any]


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def build_index(source: str, out: str | Path, *, kernels: list[tuple[int, str, Path]], note: str = "") -> dict:
    """Write `out/replay.json` for `kernels` [(problem, dsl, kernel file)] from the verdicts in dataset `source`.

    For each kernel the recorded verdict with the median speedup among its non-pair verdicts is chosen (all of them
    are real gradings of the same bytes). Problem hashes are those of the problems as they are now: the caller
    asserts that the recording graded these problem definitions (the GPU script records both in one run).
    """
    import polars as pl

    from mkb.events import read
    from mkb.experiment._problems import all_problems

    v = read("verdict", source)
    probs = all_problems()
    entries = []
    for problem, dsl, path in kernels:
        sha = _sha(path)
        rows = v.filter((pl.col("problem") == problem) & (pl.col("dsl") == dsl) & (pl.col("kernel_sha256") == sha)
                        & (pl.col("scope") != "pair")).sort("speedup", nulls_last=True)
        if rows.height == 0:
            raise ReplayError(f"{source} has no verdict for problem {problem} {dsl} kernel {sha[:12]} ({path})"
                              "\nhint: record it on a GPU first (scripts/gpu_experiment_run.py)")
        pick = rows.row(rows.height // 2, named=True)
        entries.append({"problem": problem, "problem_hash": probs[problem].hash, "dsl": dsl, "kernel_sha256": sha,
                        "kernel_file": str(path), "evaluation_id": pick["evaluation_id"], "n_recorded": rows.height})
    doc = {"source": str(source), "note": note, "kernels": entries}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / INDEX).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


class ReplayGrader:
    """Answers `submit`/`submit_batch` from recorded verdicts; writes each answer as a verdict event marked grader=replay."""

    def __init__(self, entries: dict[tuple[int, str, str], Recorded], *, writer: Any = None, source: str = "",
                 recorded_version: str = "unknown") -> None:
        self.entries, self.writer, self.source = entries, writer, source
        self.version = f"replay:{recorded_version}"
        self._n = 0
        self._lock = threading.Lock()

    @classmethod
    def load(cls, dataset: str | Path, *, writer: Any = None, store: Any = None, check_hashes: bool = True) -> "ReplayGrader":
        """Read `dataset/replay.json` and the verdicts it points at; refuse problems whose hash changed since."""
        import polars as pl

        from mkb.events import EventWriter, read
        from mkb.experiment._problems import all_problems

        d = Path(dataset)
        try:
            doc = json.loads((d / INDEX).read_text())
        except FileNotFoundError:
            raise ReplayError(f"{d / INDEX}: no replay index\nhint: the replay dataset is events/replay-demo; "
                              "record one with scripts/gpu_experiment_run.py") from None
        src = doc["source"]
        if not Path(src).is_absolute():  # relative to the working directory, the index, or the repository holding events/
            src = str(next((c for c in (Path(src), d / src, d.parent.parent / src) if c.exists()), Path(src)))
        ids = [e["evaluation_id"] for e in doc["kernels"]]
        v = read("verdict", src).filter(pl.col("evaluation_id").is_in(ids)).unique("evaluation_id")
        rows = {r["evaluation_id"]: r for r in v.iter_rows(named=True)}
        probs = all_problems()
        entries, versions = {}, set()
        for e in doc["kernels"]:
            if e["evaluation_id"] not in rows:
                raise ReplayError(f"{src}: recorded verdict {e['evaluation_id']} is missing\nhint: the replay index and its dataset disagree")
            now = probs.get(e["problem"])
            if check_hashes and (now is None or now.hash != e["problem_hash"]):
                raise ReplayError(f"problem {e['problem']} changed since its verdicts were recorded (hash {e['problem_hash'][:12]} "
                                  f"then, {now.hash[:12] if now else 'absent'} now)\nhint: re-record on a GPU: "
                                  "python scripts/gpu_experiment_run.py --out $OUT (see events/replay-demo/README.md)")
            row = rows[e["evaluation_id"]]
            versions.add(json.loads(row["details"] or "{}").get("grader_version", "unknown"))
            entries[(e["problem"], e["dsl"], e["kernel_sha256"])] = Recorded(e["problem"], e["problem_hash"], e["dsl"],
                                                                              e["kernel_sha256"], e["evaluation_id"], row)
        if writer is None and store is not None:
            writer = EventWriter(store)
        return cls(entries, writer=writer, source=src, recorded_version="+".join(sorted(versions)))

    def _answer(self, job: Any) -> Any:
        from mkb.events import uuid7
        from mkb.grader import Verdict

        sha = _sha(job.kernel_path)
        rec = self.entries.get((job.problem, job.dsl, sha))
        if rec is None:
            raise ReplayError(f"replay grader: no recorded verdict for problem {job.problem} {job.dsl} kernel {sha[:12]}: "
                              "it replays only the demo kernels\nhint: grade on a GPU (--grader gpu)")
        r = rec.row
        eid = f"replay-{uuid7()}"
        v = Verdict(evaluation_id=eid, problem=job.problem, dsl=job.dsl, kernel_sha256=sha, passed=r["passed"], reason=r["reason"],
                    speedup=r["speedup"], eager_median_us=r["eager_median_us"], candidate_median_us=r["candidate_median_us"],
                    gpu=r["gpu"], message=f"replayed from {rec.evaluation_id} ({self.source})")
        if self.writer is not None:
            scope = job.scope if job.scope in ("pair", "attempt", "submission") else "submission"
            self.writer.emit("verdict", attempt_id=job.attempt_id, evaluation_id=eid, scope=scope, problem=job.problem, dsl=job.dsl,
                             kernel_sha256=sha, passed=v.passed, reason=v.reason, speedup=v.speedup,
                             eager_median_us=v.eager_median_us, candidate_median_us=v.candidate_median_us,
                             r_at_0=v.r_at[0.0], r_at_0_5=v.r_at[0.5], r_at_1=v.r_at[1.0], r_at_2=v.r_at[2.0], r_at_4=v.r_at[4.0],
                             s=v.s, gpu=v.gpu, details=json.dumps({"grader": "replay", "grader_version": self.version,
                                                                   "replayed_evaluation_id": rec.evaluation_id,
                                                                   "replayed_from": self.source, "problem_hash": rec.problem_hash}))
        with self._lock:
            self._n += 1
        return v

    def submit(self, job: Any) -> Future:
        f: Future = Future()
        try:
            f.set_result(self._answer(job))
        except Exception as exc:  # noqa: BLE001 - delivered through the future, as the real queue does
            f.set_exception(exc)
        return f

    def submit_batch(self, jobs: list[Any]) -> list[Future]:
        out = [self.submit(j) for j in jobs]
        if self.writer is not None:
            self.writer.flush()
        return out

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()


def _main(argv: list[str] | None = None) -> int:
    """Index the baseline kernels of `--problems` (every DSL) over the verdicts recorded in `--source`."""
    import argparse

    from mkb.experiment._scripted import baseline_path

    ap = argparse.ArgumentParser(prog="python -m mkb.experiment._replay")
    ap.add_argument("--source", required=True, help="dataset holding the recorded verdicts")
    ap.add_argument("--out", required=True, help="replay dataset folder (gets replay.json)")
    ap.add_argument("--problems", default="28,72")
    ap.add_argument("--dsls", default="cute,tirx")
    ap.add_argument("--note", default="")
    a = ap.parse_args(argv)
    root = Path.cwd()
    kernels = []
    for p in (int(x) for x in a.problems.split(",")):
        for d in a.dsls.split(","):
            f = baseline_path(p, d)
            kernels.append((p, d, f.relative_to(root) if f.is_relative_to(root) else f))
    doc = build_index(a.source, a.out, kernels=kernels, note=a.note)
    print(f"{Path(a.out) / INDEX}: {len(doc['kernels'])} kernels from {a.source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
