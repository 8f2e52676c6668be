"""`grade()`: one kernel, one problem, one DSL -> a `Verdict`, every stage written as an event.

The parent never imports the candidate or a DSL package: it runs the backend's static rules on the
source, hands the job to a single-use worker from the pool, enforces the compile and wall limits by
killing the worker's process group, accepts only nonce-carrying messages, and writes the events.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from pathlib import Path
from typing import Any, Callable

from mkb._secrets import redact, secret_values
from mkb.grader._config import GraderConfig
from mkb.grader._confine import require_confinement
from mkb.grader._phases import PhaseClock, attribute, clean_timeline
from mkb.grader._pool import WARM_WAIT_S, Worker, WorkerPool
from mkb.grader._prefetch import PlanFootprint, Prepared, plan_key
from mkb.grader._precompile import DeviceCode
from mkb.grader._reasons import STAGES, Reason, static_reason
from mkb.grader._session import TrustedCache, problem_identity, trusted_key
from mkb.grader._verdict import THRESHOLDS, StageResult, Verdict, exit_failure, missing_stages_reason, timeout_failure
from mkb.problems import problem_number

GRADER_VERSION = "2.26"  # 2.26: the static rules refuse registering operator implementations with torch's dispatcher (torch.library, torch._library, torch._ops, py_impl, torch._C._dispatch_* and the like; rule monkeypatch): a review found that a kernel's Library("aten", "IMPL").impl("max", ...) passed a wrong output through the comparison on the CPU, with no Python name rebound; a killed worker already reaped is not signalled again (its pid may lead another worker's group); the comparison's quick pass leaves sparse outputs and tensor subclasses to the full rules; nothing timed changes; 2.25: a worker killed without waiting is handed to one reaper thread, started with the first worker (mkb.grader._pool._Reaper: polls each until it is gone, at most 30 s, then removes its scratch folder and records it reaped), instead of a thread started per kill: Thread.start() returns only once the new thread has run, one GIL switch interval (5 ms) per busy thread of the parent, which fits `parent.teardown`'s ~1 ms or 11-30 ms on the H200 (benchmarks/teardown_probe.py on 2 CPU cores, three runs: median 0.16-0.20 ms alone, 16-24 ms beside one or two spinning threads, 0.010-0.021 ms for the queue); not yet measured on the GPU; nothing timed or checked changes; 2.24: a worker killed without waiting (a grading that finished) leaves its scratch folder to its background reaper, which removes it once the process is gone, and the process joins those reapers at exit (Worker.cleanup), so the folder is never removed while the grading waits nor while the process could still write; it was meant to shorten `parent.teardown`, read from one run as CuTe's (3 of 4 CuTe gradings 24-27 ms, TIRx 1 ms, events/h200-grader-bench-2-23b) and did not: across the 2.22-2.24 runs the teardown is ~1 ms or 11-30 ms in either DSL, and under 2.24 it took 11-24 ms in 4 of 8 prefetched gradings (events/h200-grader-bench-2-24), so the removal was not what took it; nothing timed or checked changes; 2.23: the clock warm-up before a timing loop ends after one round when the SM clock read boosted (>= 95% of its maximum) before any work and after that round (mkb.grader._harness.warm_until_boosted), instead of running at least 30 ms: 2,197 of 2,197 recorded H200 gradings read boosted before any work, and the timed calls still come behind the side-work floor's 30 held empty calls and >= 10 held warm-ups; a clock read low keeps the 30 ms minimum; GraderConfig.clock_warm_min_s is the A/B arm (0.03: 2.22's rule; gpu_checks_ab.py --b-arm clockwarm); nothing checked changes; 2.22: a comparison decides a passing output in one device round trip (mkb.measure._compare: `_quick_pass` over the output's and its difference's min and max, with the reference's facts read when the expectation is made, `Expected.facts`) and leaves every failure to the full rules, so every verdict, reason and figure is theirs (tests/measure/test_compare_quick.py): the candidate loop's 12 re-checks took most of its `after` part, 0.05-0.10 s a grading on the H200 (events/h200-grader-bench-2-21), and the verification draws and final check use the same rules; inputs left unchanged are read by one torch.equal first; a re-checked call's comparison runs after the watched names are read again (a kernel that rebinds a torch function in one call and restores it in the next cannot steer it); the timing record has the re-checks' seconds (TimingFigures.recheck_s); nothing timed changes; 2.21: the timing record splits the candidate loop's wall time by part (TimingFigures.loop_split_s, mkb.measure.LOOP_PARTS: making sets, the hooks before and after each call, the windows, between calls), read outside every window, since on the H200 the `timing_loop` phase took 0.15-0.18 s per grading where its windows' device work is about a third of that (events/h200-grader-bench-2-20-*), the largest piece of a warm grading's overhead, and nothing recorded said where the rest went; the guard's identity check looks each watched name up again and compares objects (held, so no id is reused) instead of taking the whole snapshot again and comparing ids (3.3 ms against 0.4 ms a check on 2 cores, after every stage and verification draw; a name hidden from dir() after the snapshot is still checked); nothing timed or checked changes; 2.20: a worker makes every input set with one CPU thread (mkb.measure.one_cpu_thread; the same values): problem 1's page order is a CPU randperm per draw, which torch spread over every core, and beside busy cores its 113 timed sets took 2.0-2.1 s instead of 0.16-0.20 s with one thread (events/h200-inputs-probe: the slow `timing_inputs` of 2.13-2.19); reads confined as shipped (GraderConfig.read_guard="landlock"): every baseline, control and red-team form graded on the H200 with it as without (events/h200-grader-2-19-readguard); nothing timed or checked changes; 2.19: the timing record says where the candidate loop's `timing_inputs` went (TimingFigures.input_sets_made, mkb.measure.InputsMade: the first pass's and the sets' seconds, the process's CPU seconds, the caching allocator's cudaMalloc and cudaFree calls and retried mallocs), since problem 1's phase took ~0.2 s or ~1.9 s with the same sets and first pass (events/h200-grader-bench-2-15 .. 2-18-pause) and nothing recorded told the two apart; mkb parses kernels under one lock (mkb._ast: a CPython < 3.12.2 race made a fine kernel raise SystemError when two threads parsed at once); a grading worker and a precompile fork start without any credential-looking environment variable, and every string the grader writes from a worker (logs, notes, kernel names, details) has the parent's credential values redacted (mkb._secrets: a kernel's exception text carried the user's API key into the events before); GraderConfig.prefetch_fraction, an A/B arm for the prefetch's memory gate (1/16 as shipped); GraderConfig.read_guard (off as shipped): reads confined too, to the system's, Python's, mkb's and the grading's own files; nothing timed or checked changes; 2.18: a precompile's sandbox and builder are forks of one fork server per DSL and queue, which imported torch, the DSL and the problems once with no GPU visible and is started with the queue (a sandbox started afresh spent 10-15 s importing them on the slower H200 hosts, and 9 of 21 TIRx gradings were `late`, events/h200-grader-2-17-queue); each fork starts its own session and confines itself as before, with one thread, so the confinement reaches every thread the candidate gets; waiting jobs start in the order the queue grades them, one task per request; every server and fork is stopped while the device is in a timing phase (GpuQuiet.listen: a passing baseline failed integrity_stream beside running precompiles, events/h200-grader-bench-2-18-ab1-on); the device-code record has waited_s, sandbox_s and build_s; nothing timed or checked changes; 2.17: a queue makes each queued TIRx job's device code ahead, outside the GPU (mkb.grader._precompile; GraderConfig.precompile, CompileFigures.device_code): a sandbox that cannot open the GPU (Landlock: writes only beneath its own folder, no device ioctls from ABI 5; seccomp; CPU limit) records the CUDA sources TVM generates for the candidate's solve, a confined trusted builder compiles each as the worker's TVM would, and the worker's compile_cuda reads a build whose key names every input of the nvcc command (events/h200-precompile-probe: nvcc is 71-84% of a TIRx compile, which took 0.19-0.53 s instead of 0.86-3.01 s with the builds made ahead); a job not ready when its grading starts compiles in its worker; nothing timed or checked changes; 2.16: the prefetch's yield for a timing phase (2.13) removed: no gain in two H200 A/Bs (events/h200-grader-bench-2-13: off 2,072 vs on 1,939 gradings per GPU-hour; events/h200-grader-bench-2-15: off 1,337 vs on 1,338) and a paused prepare cost problem 1's next grading its cached input blocks (timing_inputs 1.65 s mean paused against 1.04 s); a timing phase again waits for the whole prepare running (its `quiet_wait`), no `yield`, `yielded` or `resume` message, the prefetch record no longer has `yields` or `paused_s`, and a claim waits until 5 s past the prepare's own deadline, fixed when it was sent; nothing timed or checked changes; 2.15: from the candidate's import on, a seccomp filter on every thread of the worker (TSYNC) refuses setsid, setpgid, socket, ptrace, process_vm_readv/writev, pidfd_getfd, io_uring and any non-native ABI (mkb.grader._syscall_guard; GraderConfig.syscall_guard, recorded as CompileFigures.syscall_guard): a child that left the process group outlived its grading's killpg (free to load the GPU under the next gradings' timing), a tmux, screen or systemd server of the user reached over its unix socket ran what the candidate asked outside the worker, and a thread started before Landlock's confinement could ptrace a spare worker; a process the candidate left running fails the grading as integrity_thread (the worker reaps its orphans, so any live descendant is a live child of it), checked after import, after each stage and before each profiled call's trace is exported into the scratch folder such a process could write (red-team form helper_process); no audit hook can be added once the candidate may run, the guard compares the interpreter's hooks (form interpreter_hook) and watches builtins, io and gc, and the trace is read through io.open and a decoder bound before the import; the confinement is applied at the end of the trusted phase (a failure there is infra, never the candidate's, and its stage records both guards); on a kernel with Landlock ABI 8 the write confinement reaches every thread of the worker (TSYNC), the threads started before the candidate's import included; GraderConfig.fs_guard="required" and syscall_guard="required" (mkb-run grade --confined, --grader gpu:confined) refuse to grade on a host without Landlock or seccomp filters (ConfinementUnavailable before any worker starts, which an attempt stops on as infra) and fail a grading whose worker could not be confined (infra_error); nothing timed or checked changes; 2.14: a grading worker writes only beneath its own scratch folder (its TMPDIR and DSL compile cache, removed with it) and /dev from its candidate's import on, by Landlock where the kernel has it (mkb.grader._fs_guard; GraderConfig.fs_guard, recorded as CompileFigures.fs_guard): a kernel could write the event store, the grader's source or the shared CuTe DSL cache before; the timing figures record the device segments the candidate loop's first set and first pass created (input_sets_first_pass_segments), one set's bytes and the loop's budget (input_set_bytes, input_budget_bytes: with input_sets_alive, whether the sets were all made up front; 0: the worker had the blocks cached, the figure that tells a slow timing_inputs: problem 1 took 1.8 s there in 6 of 8 gradings whose prefetch paused, events/h200-grader-bench-2-13); a prefetch's claim waits until 5 s past the prepare's own deadline, which moves on while it sits paused; the device's capability from NVML, else nvidia-smi (mkb.measure.query_gpu); nothing timed or checked changes; 2.13: a prefetch pauses for a timing phase: a pending hold asks the preparing spare to `yield`, it stops after its current expectation, syncs, answers `yielded` (no longer counted as warming) and is resumed once quiet is back (the timing phases waited up to 3 s behind problem 1's prepares on the H200); the plan's values do not depend on where it paused, the prefetch record counts `yields` and `paused_s`; nothing timed or checked changes; 2.12: two gradings in flight per GPU, measured on the H200 and not shipped (kept at 23be918; events/h200-grader-2-12-queue, h200-grader-bench-2-12: no gain, and a hostile neighbour could slow another grading's timing); 2.11: the SM hold's NVRTC build (most of the 2.10 warm start's hold_compile, 0.424 s median per worker on the H200) moved before the worker's `imported`, for the compute capability NVML reports (no CUDA context, not under the quiet rule; warm_start_s.hold_nvrtc_before_go), so the warm-up a spare holds the device for only loads and launches the cubin (CompileFigures.hold_build "prebuilt", else "compiled (why)" as in 2.10); same source and options, nothing timed or checked changes; 2.10: the worker's GPU warm start recorded by step (CompileFigures.warm_start_s: cuda_context_and_profiler_init, sm_clock, hold_compile, first_use), the warm-up a spare holds the device for; nothing timed or checked changes; 2.9: the side-work floor's hold recorded (floor_hold_us) and offered as an A/B arm (GraderConfig.floor_hold_us; the shipped grader keeps the 1 ms default: nothing timed or checked changes); 2.8: timing policy v6: the timed sets' first pass allocates their blocks only (InputStream(first_pass="allocate")), v5's state for microseconds instead of making every set twice (0.16 s per grading; every short baseline within 0.5% of v5 ABBA, events/h200-checks-ab-allocate); 2.7: the timing figures record the device segments the allocator created while the timed sets were made (input_sets_new_segments, the eager's too): the figure that tells a grading whose sets missed the recycled blocks (nothing timed or checked changes); 2.6: timing policy v5: every timed loop's input sets (the eager's and the candidate's) lie in recycled caching-allocator blocks (InputStream(first_pass="make")), so a worker that timed the eager and one that read it from the cache time in one state (they differed by up to 4.4% for short kernels: events/h200-recycle-levels); the launch floors cached per DSL and GPU, not per problem; a spare's go deferred until the running grading's timing phase ends (at most 3 s); 2.5: with a backlog, the next job's trusted plan is made ahead by the spare that grades it (mkb.grader._prefetch; the same plan from its own secret, keyed, under the quiet rule, memory-gated), recorded in the verdict's details.prefetch; nothing timed or checked changes; 2.4: every second of wall_s in a named phase (the verdict's details.phases_s), cuBLAS and the timing window's kernels first used in the warm start, and timing policy v4: the SM hold is a raw NVRTC kernel spinning every thread slot on clock64() with no memory traffic (the jiterator hold's 8.6 MB write slowed and moved short kernels); 2.3: sampled expectations where the whole ones do not fit the device (34, 38, 50 at full size; nothing changes for problems that fit); 2.2: the side-work check also takes the empty calls' tails after the loop; 2.1: device-time window (host dispatch hidden by a GPU sleep, reported beside it), spinning tails; 2.0: host-compute / allowlist-work / write checks, crash after import counts, early stop, GPU table


def _jsonable(v: Any) -> str | None:
    return None if v is None else json.dumps(v, default=str)


def _run_worker(worker: Worker, job: dict, cfg: GraderConfig, *, cache: TrustedCache | None = None,
                problem_hash: str = "unknown", pinned: dict | None = None,
                fresh_eager: bool = False, clock: PhaseClock | None = None,
                on_compile: Callable[[], None] | None = None,
                on_plan: Callable[[PlanFootprint], None] | None = None) -> tuple[list[StageResult], str | None, str, dict]:
    """Drive one job; returns (stages, failure reason not tied to a stage, log, bookkeeping).

    `pinned` trusted figures (a pair re-grade's one eager timing) win over the cache; `fresh_eager`
    measures eager even when the cache has it (the first grading of such a batch). What the worker
    measured before the candidate existed comes back in `book["trusted_fresh"]`. `clock` gets the parent's
    phases (worker_wait, trusted_lookup, worker_job, teardown; mkb.grader._phases).
    """
    clock = clock or PhaseClock()
    nonce = secrets.token_hex(16)
    book: dict[str, Any] = {"worker_pid": worker.pid}
    t_wait = time.monotonic()
    worker.quiet.urge(worker)  # if it is still starting, this grading waits for it: its `go` is never deferred
    if not worker.wait_ready(cfg.start_limit_s):
        clock.mark("worker_wait")
        worker.kill()
        worker.cleanup()
        clock.mark("teardown")
        return [], Reason.INFRA_ERROR, f"worker did not start: {worker.ready_error}", book
    book["worker_wait_s"] = time.monotonic() - t_wait
    clock.mark("worker_wait")
    worker.quiet.grading_started(worker, pid=worker.pid)  # spares importing from now on warm up after its timing phase
    book["worker_start_s"] = worker.ready.get("start_s")
    book["gpu"] = worker.ready.get("gpu")
    book["worker_quiet_wait_s"] = worker.ready.get("quiet_wait_s")
    keys = {}
    hit: dict[str, dict] = {}
    if cache is not None and isinstance(job.get("problem"), int):
        for what in ("eager", "reference", f"floor:{job['dsl']}"):  # the floor's key has the DSL, not the problem
            keys[what.split(":")[0]] = trusted_key(what, problem=job["problem"], problem_hash=problem_hash,
                                                   ready=worker.ready, cfg=cfg, grader_version=GRADER_VERSION)
        hit = {k: v for k, v in ((k, cache.get(key)) for k, key in keys.items() if not (fresh_eager and k == "eager"))
               if v is not None}
    hit.update(pinned or {})
    if hit:
        job = {**job, "trusted": hit}
    book["trusted_cached"] = sorted(hit)
    clock.mark("trusted_lookup")
    try:
        return _drive(worker, job, cfg, cache, keys, nonce, book, clock, on_compile=on_compile, on_plan=on_plan)
    finally:
        worker.quiet.release(worker, pid=worker.pid)  # a hold never outlives its grading (crash, timeout, forged message)
        worker.quiet.timing_ended(worker, pid=worker.pid)  # nor does a deferral of spares' `go`s


def _drive(worker: Worker, job: dict, cfg: GraderConfig, cache: TrustedCache | None, keys: dict, nonce: str,
           book: dict, clock: PhaseClock, *, on_compile: Callable[[], None] | None = None,
           on_plan: Callable[[PlanFootprint], None] | None = None) -> tuple[list[StageResult], str | None, str, dict]:
    worker.send_job({**job, "type": "job", "nonce": nonce})
    t_job = time.monotonic()  # `worker_job` (the clock's span from here back to `trusted_lookup`) includes the send
    wall_deadline = t_job + cfg.wall_limit_s
    deadline = wall_deadline
    phase = "setup"
    stages: list[StageResult] = []
    failure: str | None = None
    notes: list[str] = []
    done = False
    holding: str | None = None  # the GPU-sensitive phase the worker announced last
    while True:
        msg = worker.reader.read(deadline)
        if msg == "timeout":
            failure = timeout_failure(phase)
            limit = cfg.compile_limit_s if phase == "compile" else cfg.wall_limit_s
            notes.append(f"killed after the {phase} phase ran past its {limit:.0f} s limit")
            break
        if msg == "eof":
            break
        if msg.get("nonce") != nonce:
            failure = Reason.INTEGRITY_RESULT_CHANNEL
            notes.append(f"a message without the harness nonce arrived on the result channel: {json.dumps(msg)[:500]}")
            break
        kind = msg.get("type")
        if kind == "trusted":
            # written before the candidate was imported (it precedes the compile phase message): cacheable
            if phase == "setup":
                fresh = {w: msg[w] for w in ("eager", "reference", "floor") if isinstance(msg.get(w), dict)}
                book["trusted_fresh"] = fresh
                if cache is not None:
                    for what, fig in fresh.items():
                        if keys.get(what) is not None:
                            cache.put(keys[what], fig)
        elif kind == "hold":
            # a GPU-sensitive phase (eager timing, the timing loop): spares' GPU warm-ups wait until it ends
            if msg.get("on"):
                holding = str(msg.get("what", ""))
                waited = worker.quiet.hold(worker, holding, pid=worker.pid,
                                    timeout=min(WARM_WAIT_S, max(0.0, wall_deadline - time.monotonic())))
                book["hold_wait_s"] = book.get("hold_wait_s", 0.0) + waited
                worker.send_go()
            else:
                worker.quiet.release(worker, pid=worker.pid)
                if holding == "timing":  # the candidate's timing loop is over: deferred spares go now
                    worker.quiet.timing_ended(worker, pid=worker.pid)
                holding = None
        elif kind == "plan":
            # the trusted plan's footprint and whether it was prefetched, sent before the compile phase message
            if phase == "setup" and "plan" not in book:
                book["plan"] = {k: msg.get(k) for k in ("prefetched", "discarded", "prepare_s", "kept_bytes", "input_bytes",
                                                        "working_bytes", "free_bytes", "expectations")}
                foot = PlanFootprint.from_msg(msg)
                if on_plan is not None and foot is not None:
                    on_plan(foot)
        elif kind == "phase":
            phase = msg["phase"]
            if phase == "compile":
                book["compile_started_s"] = time.monotonic() - t_job
                deadline = min(wall_deadline, time.monotonic() + cfg.compile_limit_s)
                if on_compile is not None:  # the queue's prefetch of the next job's plan: beside this compile
                    try:
                        on_compile()
                    except Exception as exc:  # noqa: BLE001 - a prefetch that cannot start leaves the next job lazy
                        book["prefetch_start_error"] = f"{type(exc).__name__}: {exc}"[:500]
            else:
                deadline = wall_deadline
        elif kind == "stage":
            stages.append(StageResult(msg["stage"], bool(msg["ok"]), msg.get("reason"), msg.get("figures") or {}, msg.get("log") or ""))
        elif kind == "timeline":
            # the worker's own phases (attribution only, never a verdict input); the first well-formed one counts
            if "worker_timeline" not in book:
                line = clean_timeline(msg.get("phases_s"))
                if line is not None:
                    book["worker_timeline"] = line
        elif kind == "harness_error":
            failure = Reason.RUNTIME_ERROR if phase in ("compile", "run") else Reason.INFRA_ERROR
            notes.append("harness error:\n" + msg.get("log", ""))
        elif kind == "done":
            done = True
            break
    clock.mark("worker_job")
    if worker.reader.bad_lines and failure is None:
        failure = Reason.INTEGRITY_RESULT_CHANNEL
        notes.append(f"unparseable lines on the result channel: {worker.reader.bad_lines[:3]}")
    log = worker.log_text()  # before the kill: the worker's own output is complete once it has ended or reported done
    rc = worker.kill(wait=not done)
    book["exit_status"] = rc
    book["phase"] = phase
    if not done and failure is None:
        # the process ended without the harness's completion message: whose fault is mkb.grader._verdict's rule
        failure, note = exit_failure(phase=phase, exit_status=rc)
        notes.append(note)
    if not done:
        log = worker.log_text()
    worker.cleanup()
    clock.mark("teardown")
    if notes:
        log = "\n".join(notes) + "\n--- worker output ---\n" + log
    return stages, failure, log, book


def grade(problem: int | str | Path, dsl: str, kernel_path: str | Path, *, store: Any = None, writer: Any = None,
          config: GraderConfig | None = None, pool: WorkerPool | None = None, scope: str = "submission",
          attempt_id: str | None = None) -> Verdict:
    """Grade `kernel_path` as the `dsl` variant of `problem`; write compile/verification/timing/integrity/verdict events.

    `writer` (an EventWriter) wins over `store` (a URL); with neither, the default store is used.
    Pass a long-lived `pool` to keep workers warm across calls; without one, a worker is spawned
    for this call and nothing is left running afterwards. Many gradings, from many threads or
    tasks, go through a `GradingQueue` instead (one per GPU).
    """
    own_writer = writer is None
    if own_writer:
        from mkb.events import EventWriter

        writer = EventWriter(store)
    try:
        verdict, _ = grade_with(problem, dsl, kernel_path, writer=writer, config=config, pool=pool, scope=scope,
                                attempt_id=attempt_id)
    finally:
        if own_writer:
            writer.close()
    return verdict


def plan_job_fields(problem: int | str | Path, dsl: str, cfg: GraderConfig, problem_hash: str) -> dict:
    """The job fields a trusted plan depends on, but the secret (mkb.grader._prefetch.plan_key): one builder for the
    job and for a prefetch of it, so the two can only match when they are the same job."""
    from mkb.grader._backends import backend_target

    return {"problem": problem_number(problem) if not isinstance(problem, Path) and str(problem).isdigit() else str(problem),
            "dsl": dsl, "backend": backend_target(dsl), "config": cfg.as_dict(), "problem_hash": problem_hash}


def grade_with(problem: int | str | Path, dsl: str, kernel_path: str | Path, *, writer: Any,
               config: GraderConfig | None = None, pool: WorkerPool | None = None, scope: str = "submission",
               attempt_id: str | None = None, queue_wait_s: float | None = None, pinned: dict | None = None,
               fresh_eager: bool = False, pair_id: str | None = None, prepared: Prepared | None = None,
               on_compile: Callable[[], None] | None = None,
               on_plan: Callable[[PlanFootprint], None] | None = None,
               device_idle_s: float | None = None, device_code: DeviceCode | None = None) -> tuple[Verdict, dict]:
    """One grading on `pool` with its events emitted to `writer` (the queue's and `grade`'s shared core).

    Returns the verdict and the trusted figures the worker measured fresh (for a batch's one eager timing).
    `prepared`: a prefetch made for this job (mkb.grader._prefetch), claimed here; its worker grades the job with its
    secret only if it made the plan and the plan's key is this job's, else the job takes a spare (a failed prepare's
    worker is killed) with a fresh secret. `on_compile` is called once the worker starts the candidate's compile (the
    queue starts the next job's prefetch there); `on_plan` gets the trusted plan's footprint (the prefetch gate).
    `device_code`: what the queue made ahead for this job (mkb.grader._precompile); the worker reads its builds and
    records it with the compile.
    """
    from mkb.grader._backends import backend_from_target, backend_target
    from mkb.grader._jsonl import uuid7

    cfg = config or GraderConfig()
    require_confinement(cfg)  # before any worker: an attempt stops on this as infra, spending no submission
    t_req = time.monotonic()
    clock = PhaseClock(t_req)
    kernel_path = Path(kernel_path).resolve()
    try:
        source = kernel_path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{kernel_path}: cannot read the kernel ({exc})\nhint: pass the path of a kernel.py") from None
    sha = hashlib.sha256(source.encode()).hexdigest()
    number = problem_number(problem)
    evaluation_id = uuid7()
    backend = backend_from_target(backend_target(dsl), dsl)
    clock.mark("read_kernel")

    stages: list[StageResult] = []
    failure: str | None = None
    log = ""
    book: dict[str, Any] = {}
    prefetch: dict[str, Any] = {"state": "none", "wait_s": 0.0, "secret_used": False}  # no prefetch was made for it
    phash = problem_identity(number)  # on the verdict: a figure is read only against the problem it was graded on
    clock.mark("problem_identity")
    findings = tuple(backend.static_rules(source))
    clock.mark("static_rules")
    if findings:
        if prepared is not None:  # its job never reaches a worker: the plan's worker is dropped
            prepared.drop()
            prefetch = {"state": "dropped", "wait_s": 0.0, "secret_used": False}
        msg = "\n".join(f"kernel.py:{f.line or 0}: [{f.rule}] {f.message}" for f in findings)
        stages.append(StageResult("compile", False, static_reason(findings[0].rule), {"static_rules": [f.rule for f in findings]}, msg))
    else:
        own_pool = pool is None
        pool = pool or WorkerPool((dsl,), device=cfg.device, prestart=False, refill_on_take=False)
        try:
            job = {**plan_job_fields(problem, dsl, cfg, phash), "kernel_path": str(kernel_path), "secret": None}
            if device_code is not None and device_code.state != "off":
                job["device_code"] = {**device_code.as_dict(),
                                      "folder": str(device_code.folder) if device_code.folder is not None else None}
            worker = None
            if prepared is not None:
                worker, prefetch = _claim(prepared, job)
                if prefetch["state"] == "ready":
                    job["secret"] = prepared.fields["secret"]
                clock.mark("prefetch_wait")
            if worker is None:
                worker = pool.take(dsl)
            if job["secret"] is None:  # never the secret of a prepare whose plan is not this worker's
                job["secret"] = secrets.randbits(62)
            clock.mark("pool_take")
            stages, failure, log, book = _run_worker(worker, job, cfg, cache=None if own_pool else pool.trusted,
                                                     problem_hash=phash, pinned=pinned,
                                                     fresh_eager=fresh_eager, clock=clock, on_compile=on_compile,
                                                     on_plan=on_plan)
        finally:
            if own_pool:
                pool.close()
                clock.mark("pool_close")

    plan = book.get("plan") or {}
    prefetch = {**prefetch, "plan_used": plan.get("prefetched"), "plan_discarded": plan.get("discarded")}
    verdict = _verdict(evaluation_id, number, dsl, sha, stages, failure, log, book, t_req, queue_wait_s,
                       problem_hash=None if phash == "unknown" else phash, clock=clock, prefetch=prefetch,
                       device_idle_s=device_idle_s)
    _emit(writer, verdict, attempt_id=attempt_id, scope=scope, failure_log=log, pair_id=pair_id,
          config_overrides=cfg.overrides())
    return verdict, dict(book.get("trusted_fresh") or {})


def _claim(prepared: Prepared, job: dict) -> tuple[Worker | None, dict]:
    """The prefetch's worker for `job` (None: take a spare) and its record; a plan of another key is never used."""
    worker, rec = prepared.claim()
    if rec["state"] == "ready" and plan_key({**job, "secret": prepared.fields["secret"]}) != prepared.key:
        # made for other fields (the problem's files changed, another config): its worker holds that plan, so it goes
        worker.kill()
        worker.cleanup()
        worker, rec = None, {**rec, "state": "mismatch", "secret_used": False}
    return worker, rec


def _verdict(evaluation_id: str, number: int, dsl: str, sha: str, stages: list[StageResult], failure: str | None,
             log: str, book: dict, t_req: float, queue_wait_s: float | None = None, *,
             problem_hash: str | None = None, clock: PhaseClock | None = None, prefetch: dict | None = None,
             device_idle_s: float | None = None) -> Verdict:
    by = {s.stage: s for s in stages}
    reason = None
    for name in STAGES:
        s = by.get(name)
        if s is not None and not s.ok:
            reason = s.reason
            break
    if reason is None and failure is not None:
        reason = str(failure)
        # attach the failure to the stage that was running, so an event says what broke
        missing = next((n for n in STAGES if n not in by), "verification")
        stages.append(StageResult(missing, False, reason, {}, log))
    elif reason is None and any(n not in by for n in STAGES):
        reason = missing_stages_reason(book.get("phase", "setup"))
        stages.append(StageResult(next(n for n in STAGES if n not in by), False, reason, {}, "the worker ended without reporting every stage\n" + log))
    timing = by.get("timing")
    tf = timing.timing if timing is not None else None
    t_fig = timing.figures if timing is not None and timing.ok else {}
    cand = tf.median_us if tf else None
    eager = tf.eager_median_us if tf else None
    passed = reason is None
    speedup = tf.speedup if tf else None
    gpu = (tf.gpu if tf else None) or book.get("gpu") or "unknown"
    comp = by.get("compile")
    compile_s = (comp.figures.get("compile_s") or 0.0) if comp else 0.0
    kernel_s = compile_s + (t_fig.get("timed_s") or 0.0)
    if clock is not None:
        clock.mark("verdict")
    wall = time.monotonic() - t_req
    phases = attribute(wall_s=wall, parent=clock.s, worker=book.get("worker_timeline"), compile_s=compile_s,
                       timed_s=t_fig.get("timed_s")) if clock is not None else None
    return Verdict(
        evaluation_id=evaluation_id, problem=number, dsl=dsl, kernel_sha256=sha, passed=passed, reason=reason,
        speedup=speedup if passed else None, eager_median_us=eager, candidate_median_us=cand, gpu=gpu,
        stages=tuple(stages), wall_s=wall, overhead_s=wall - kernel_s, worker_wait_s=book.get("worker_wait_s"),
        queue_wait_s=queue_wait_s, message=next((s.log for s in stages if not s.ok), "")[:4000],
        gpu_model=tf.gpu_model if tf else None, gpu_arch=tf.gpu_arch if tf else None,
        timed_calls=tf.n_timed if tf else None, reference_median_us=tf.reference_median_us if tf else None,
        speedup_upstream=(tf.speedup_upstream if tf and passed else None), problem_hash=problem_hash,
        phases_s=phases, prefetch=prefetch, device_idle_s=device_idle_s,
    )


def _emit(writer: Any, v: Verdict, *, attempt_id: str | None, scope: str, failure_log: str,
          pair_id: str | None = None, config_overrides: dict[str, Any] | None = None) -> None:
    common = dict(evaluation_id=v.evaluation_id, problem=v.problem, dsl=v.dsl, kernel_sha256=v.kernel_sha256)
    secrets = secret_values()  # whatever a worker printed (its kernel's text, names, notes) is written without them
    for s in v.stages:
        f = redact(dict(s.figures), secrets)
        log = s.log or None
        if not s.ok and failure_log and failure_log not in (s.log or ""):
            log = ((s.log or "") + "\n--- worker output ---\n" + failure_log)
        log = redact(log, secrets)
        reason = redact(s.reason, secrets)  # a worker's reason is its own text until the parent checks it
        if s.stage == "compile":
            writer.emit("compile", attempt_id=attempt_id, **common, ok=s.ok, reason=reason,
                        compile_s=f.pop("compile_s", None), log=log, details=_jsonable(f or None))
        elif s.stage == "verification":
            writer.emit("verification", attempt_id=attempt_id, **common, ok=s.ok, reason=reason,
                        draws=f.get("draws"), max_abs_err=f.get("max_abs_err"), tolerance=f.get("tolerance"),
                        details=_jsonable(f.get("details")), log=log)
        elif s.stage == "timing":
            cols = {k: f.pop(k, None) for k in ("median_us", "iqr_us", "cv", "eager_median_us", "n_warmup", "n_timed",
                                                "launch_floor_us", "gpu", "timing_policy")}
            clocks = f.pop("clocks", None)
            writer.emit("timing", attempt_id=attempt_id, **common, ok=s.ok, reason=reason, **cols,
                        clocks=_jsonable(clocks), log=log, details=_jsonable(f or None))
        elif s.stage == "integrity":
            writer.emit("integrity", attempt_id=attempt_id, **common, ok=s.ok, reason=reason,
                        kernels_seen=f.pop("kernels_seen", None), log=log, details=_jsonable(f or None))
    r = v.r_at
    writer.emit(
        "verdict", attempt_id=attempt_id, evaluation_id=v.evaluation_id, scope=scope, problem=v.problem, dsl=v.dsl,
        kernel_sha256=v.kernel_sha256, passed=v.passed, reason=redact(v.reason, secrets), speedup=v.speedup,
        eager_median_us=v.eager_median_us, candidate_median_us=v.candidate_median_us,
        r_at_0=r[THRESHOLDS[0]], r_at_0_5=r[THRESHOLDS[1]], r_at_1=r[THRESHOLDS[2]], r_at_2=r[THRESHOLDS[3]],
        r_at_4=r[THRESHOLDS[4]], s=v.s, gpu=v.gpu, gpu_model=v.gpu_model, gpu_arch=v.gpu_arch, timed_calls=v.timed_calls,
        reference_median_us=v.reference_median_us, speedup_upstream=v.speedup_upstream, s_upstream=v.s_upstream,
        queue_wait_s=v.queue_wait_s, pair_id=pair_id, problem_hash=v.problem_hash,
        details=_jsonable(redact({"wall_s": v.wall_s, "overhead_s": v.overhead_s, "worker_wait_s": v.worker_wait_s,
                                  "phases_s": v.phases_s, "prefetch": v.prefetch, "device_idle_s": v.device_idle_s,
                                  "grader_version": GRADER_VERSION, "config_overrides": config_overrides or {},
                                  **_expectations(v)}, secrets)),
    )


_EXPECTATION_FIGURES = ("expectations", "sampled_positions", "expectations_kept_bytes", "expectations_whole_bytes",
                        "expectation_working_bytes", "device_free_bytes")


def _expectations(v: Verdict) -> dict[str, Any]:
    """How the grading kept its expectations (grader 2.3: whole, or sampled with the positions per output), from a
    passed verification stage, for the verdict's details (the verification event's details hold the draws)."""
    s = v.stage("verification")
    if s is None or s.figures.get("expectations") is None:
        return {}
    return {"expectations": {k: s.figures.get(k) for k in _EXPECTATION_FIGURES}}
