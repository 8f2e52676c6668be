"""Median per (problem, mode) over reps >= 1 (rep 0: the process's first compile, listed apart)."""
import json, sys, statistics as st, collections
rows = collections.defaultdict(list)
first = {}
for f in sys.argv[1:]:
    for line in open(f):
        if not line.startswith('{"problem"'): continue
        d = json.loads(line)
        k = (d["problem"], d["mode"])
        (rows[k].append(d) if d["rep"] else first.setdefault(k, []).append(d))
F = ["cute.compile", "a_trace", "b_pipeline", "c_ffi_hook", "c_jit_engine", "c_lookup", "c_build_fn", "c_export_o3", "c_jitlink_load", "replay_parse"]
print("prob mode    n hits " + " ".join(f"{x:>10s}" for x in F) + "   first(rep0) total")
for k in sorted(rows):
    v = rows[k]
    med = [st.median(d.get(x, 0.0) for d in v) for x in F]
    print(f"{k[0]:>4} {k[1]:7s} {len(v):2d} {sum(d['hits'] for d in v):3d}  " + " ".join(f"{m:10.3f}" for m in med) + "   " + ",".join(f"{d['cute.compile']:.2f}" for d in first.get(k, [])))
