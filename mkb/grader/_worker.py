"""Entry point of a single-use grader worker: warm start (torch, the DSL, CUDA), then one job, then exit.

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


def _read_job(fd: int) -> dict:
    import json

    buf = b""
    while b"\n" not in buf:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise EOFError("the parent closed the job pipe before sending a job")
        buf += chunk
    return json.loads(buf.split(b"\n", 1)[0])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="mkb-grader-worker")
    ap.add_argument("--job-fd", type=int, required=True)
    ap.add_argument("--result-fd", type=int, required=True)
    ap.add_argument("--dsl", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default=None, help="module:Class of the backend (default: the registry's entry for --dsl)")
    a = ap.parse_args(argv)

    from mkb.grader._protocol import write_msg

    t0 = time.perf_counter()
    try:
        import importlib

        import torch

        from mkb.grader._backends import backend_from_target

        backend = backend_from_target(a.backend, a.dsl)
        for name in backend.import_modules:
            importlib.import_module(name)
        import mkb.grader._harness as harness

        harness.warm_start(a.device)  # profiler (CUPTI) init and stream calibration, off the job's clock

        gpu = "cpu"
        if a.device == "cuda":
            torch.cuda.init()
            torch.empty(1, device="cuda").fill_(0)
            torch.cuda.synchronize()
            gpu = torch.cuda.get_device_name()
    except BaseException:  # noqa: BLE001
        write_msg(a.result_fd, {"type": "start_failed", "log": traceback.format_exc()[-20000:]})
        os._exit(3)
    write_msg(a.result_fd, {"type": "ready", "pid": os.getpid(), "start_s": time.perf_counter() - t0, "gpu": gpu,
                            "torch": torch.__version__, "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")})

    job = _read_job(a.job_fd)
    nonce = job.pop("nonce")
    fd = a.result_fd

    def send(msg: dict) -> None:
        write_msg(fd, {**msg, "nonce": nonce})

    try:
        harness.evaluate(job, send)
    except BaseException:  # noqa: BLE001 - a harness bug: reported, the parent classifies it
        send({"type": "harness_error", "log": traceback.format_exc()[-20000:]})
    send({"type": "done"})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: the candidate's atexit hooks and destructors never run


if __name__ == "__main__":
    main()
