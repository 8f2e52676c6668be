"""Entry point of a single-use grader worker: warm start (torch, the DSL, CUDA), then one job, then exit.

The warm start has two halves: the imports and the SM hold's NVRTC build (CPU only) run at once and end with an
`imported` message; the GPU half (CUDA init, profiler init, stream calibration) starts only when the parent
sends `go` on the job pipe, which it does while no other worker of this process is timing (the
quiet rule, mkb.grader._pool). The job's own GPU-sensitive phases send `hold` and wait for `go` too. A ready
worker may get one `prepare` before its job (the job's trusted plan made ahead, mkb.grader._prefetch); the parent
sends it under the same quiet rule and sends the job only once the `prepared` reply has come.

Started by `WorkerPool` with subprocess (fork+exec of a fresh interpreter, never a fork of a process
that imported tvm, which poisons CUDA in forked children), in its own process group so a hang is
killed with everything it started. It imports only torch, the DSL's `import_modules`, mkb.measure and
the harness: no polars, no event store (the parent writes the events).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback


def _read_msg(jobs, want: str | None = None) -> dict:
    """The next message from the parent (of type `want`, others skipped); EOFError when the parent is gone."""
    while True:
        msg = jobs.read(time.monotonic() + 86400.0)
        if msg == "eof":
            raise EOFError("the parent closed the job pipe")
        if isinstance(msg, dict) and (want is None or msg.get("type") == want):
            return msg


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="mkb-grader-worker")
    ap.add_argument("--job-fd", type=int, required=True)
    ap.add_argument("--result-fd", type=int, required=True)
    ap.add_argument("--dsl", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default=None, help="module:Class of the backend (default: the registry's entry for --dsl)")
    a = ap.parse_args(argv)

    from mkb.grader._protocol import LineReader, write_msg

    jobs = LineReader(a.job_fd)
    t0 = time.perf_counter()
    try:
        import importlib

        import torch

        from mkb.grader._backends import backend_from_target

        backend = backend_from_target(a.backend, a.dsl)
        for name in backend.import_modules:
            importlib.import_module(name)
        import mkb.grader._harness as harness

        harness.build_hold_before_go(a.device)  # the SM hold's NVRTC build: CPU work, no CUDA context; never raises
        # CPU work is done; the GPU half waits until no other worker of the parent's process is timing
        import_s = time.perf_counter() - t0
        write_msg(a.result_fd, {"type": "imported", "import_s": import_s, "imported_at": time.monotonic()})
        t_wait = time.monotonic()
        _read_msg(jobs, "go")
        gpu_warm_started = time.monotonic()
        harness.warm_start(a.device)  # profiler (CUPTI) init and stream calibration, off the job's clock

        gpu = "cpu"
        if a.device == "cuda":
            torch.cuda.init()
            torch.empty(1, device="cuda").fill_(0)
            torch.cuda.synchronize()
            gpu = torch.cuda.get_device_name()
        gpu_warm_done = time.monotonic()
    except BaseException as exc:  # noqa: BLE001
        named = getattr(sys.modules.get("mkb.grader._harness"), "WarmStartError", ())  # () if the import itself failed
        what = str(exc) if isinstance(exc, named) else f"{type(exc).__name__}: {exc}".splitlines()[0]
        write_msg(a.result_fd, {"type": "start_failed", "what": what[:2000], "log": traceback.format_exc()[-20000:]})
        os._exit(3)
    # monotonic stamps: CLOCK_MONOTONIC is one clock for every process of the host, so the parent and
    # tests can line them up with other workers' phases
    write_msg(a.result_fd, {"type": "ready", "pid": os.getpid(), "start_s": time.perf_counter() - t0, "gpu": gpu,
                            "torch": torch.__version__, "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                            "import_s": import_s, "quiet_wait_s": gpu_warm_started - t_wait,
                            "gpu_warm_started": gpu_warm_started, "gpu_warm_done": gpu_warm_done})

    try:
        while True:  # at most one prepare (the next job's plan, mkb.grader._prefetch) may come before the job
            job = _read_msg(jobs)
            if job.get("type") == "job":
                break
            if job.get("type") == "prepare":  # no candidate exists here yet: the reply carries no nonce
                write_msg(a.result_fd, {"type": "prepared", **harness.prepare(job)})
    except EOFError:
        os._exit(3)
    nonce = job.pop("nonce")
    fd = a.result_fd

    def send(msg: dict) -> None:
        write_msg(fd, {**msg, "nonce": nonce})

    try:
        harness.evaluate(job, send, wait_go=lambda: _read_msg(jobs, "go"))
    except BaseException:  # noqa: BLE001 - a harness bug: reported, the parent classifies it
        send({"type": "harness_error", "log": traceback.format_exc()[-20000:]})
    send({"type": "done"})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: the candidate's atexit hooks and destructors never run


if __name__ == "__main__":
    main()
