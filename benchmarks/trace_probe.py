"""Record what this host's torch profiler keeps in memory beside the Chrome trace it exports, for the calls the
integrity check reads (fills, copies each way, host syncs, side streams), so the grader can read the trace without a
file (DESIGN, System calls: the trace file lies where a candidate's process could write).

Writes `trace_probe.json`: per scenario, the exported trace's events and every in-memory event with every accessor
this torch has; and prints whether the two agree as the integrity check reads them. Run on a GPU host:
    python benchmarks/trace_probe.py --out $OUT/probe
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile


def _accessors(ev) -> dict:
    out = {}
    for name in dir(ev):
        if name.startswith("_"):
            continue
        try:
            v = getattr(ev, name)()
        except Exception as e:  # noqa: BLE001 - a probe records what fails too
            v = f"<error {type(e).__name__}: {e}>"
        if not isinstance(v, (int, float, str, bool, type(None))):
            v = repr(v)
        out[name] = v
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mkb-trace-probe"))
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from mkb.grader._trace import SOLVE_RANGE, call_trace

    dev = torch.device(a.device)
    x = torch.randn(1 << 20, device=dev)
    side = torch.cuda.Stream(device=dev)

    def on_side():
        with torch.cuda.stream(side):
            y = x * 2
        side.synchronize()
        return y

    scenarios = {
        "fill": lambda: x.fill_(1.0),
        "item": lambda: (x * 3).sum().item(),
        "d2h_4mb": lambda: x.cpu(),
        "h2d_list": lambda: torch.tensor(list(range(1000)), device=dev),
        "side_stream": on_side,
        "matmul": lambda: torch.randn(512, 512, device=dev) @ torch.randn(512, 512, device=dev),
        "memset_zero": lambda: torch.zeros(1 << 18, device=dev),
        "d2d_copy": lambda: x.clone(),
    }
    record = {"torch": torch.__version__, "cuda": torch.version.cuda, "scenarios": {}}
    for name, fn in scenarios.items():
        fn()  # warm: the first call of an op loads its kernels
        torch.cuda.synchronize(dev)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with record_function(SOLVE_RANGE):
                fn()
            torch.cuda.synchronize(dev)
        res = prof.profiler.kineto_results
        mem = [_accessors(e) for e in res.events()]
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        prof.export_chrome_trace(path)
        with open(path) as f:
            chrome = json.load(f)
        os.unlink(path)
        ct = call_trace(chrome)
        record["scenarios"][name] = {
            "trace_start_ns": res.trace_start_ns(),
            "result_accessors": sorted(m for m in dir(res) if not m.startswith("_")),
            "memory_events": mem,
            "chrome_events": [e for e in chrome.get("traceEvents", []) if e.get("ph") == "X"],
            "call_trace_from_file": {"launches": [l.__dict__ for l in ct.launches], "host_syncs": ct.host_syncs,
                                     "d2h_bytes": ct.d2h_bytes},
        }
        kinds = sorted({m.get("activity_type") for m in mem if isinstance(m.get("activity_type"), str)})
        print(f"{name}: {len(mem)} memory events {kinds}, file: {len(ct.launches)} launches, "
              f"{ct.host_syncs} syncs, {ct.d2h_bytes} d2h bytes", flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "trace_probe.json"), "w") as f:
        json.dump(record, f, indent=1, default=str)
    print(f"wrote {os.path.join(a.out, 'trace_probe.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
