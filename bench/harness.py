#!/usr/bin/env python3
"""larder benchmark harness; started by bench/run (see docs/benchmarks.md).

Everything it starts listens on 127.0.0.1 only, every load run is wrk with a
fixed duration, and every process it starts is stopped on exit, whatever
happens (try/finally, atexit, SIGINT/SIGTERM/SIGHUP handlers, PR_SET_PDEATHSIG
on each child, and bench/run's own trap over the process groups recorded in
$LARDER_BENCH_PGFILE).

This file is the command line and the order of a run; its parts are in bench/lib (see
bench/lib/__init__.py). The scenarios that run on their own (push_bench.py, tiers_bench.py) are
built on bench/lib as well; only this entry point names them.
"""

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import sys
import time

from lib.common import (DATA, FIXED_OVERHEAD_S, MIN_RUN_S, PAIR_OVERHEAD_S, PORTS, REPO, RESULTS,
                        RUN_OVERHEAD_S, SCENARIOS, SUITE_BUDGET_S, WRK_THREADS, log, warn)
from lib.processes import Procs, cpu_busy_pct, port_busy, raise_nofile
from lib.builds import machine_facts
from lib.environment import Env
from lib.scenarios import goals, only_systems, plan_seconds, scenario_cells
from lib.runners import run_scenario
from lib.report import chart, markdown, update_docs


def main():
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__.split("\n")[0])
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                    help=f"any of {', '.join(SCENARIOS)} (default: all), or push "
                         "(SSE fan-out against nginx + nchan, bench/push_bench.py), or tiers "
                         "(disk and shared cache tiers, bench/tiers_bench.py), or limits (how exactly a rate "
                         "limit holds, one node and a fleet of two, bench/limits_bench.py)")
    ap.add_argument("--quick", action="store_true", help="3 s per run instead of 10 s")
    ap.add_argument("--duration", type=int, help="seconds per wrk run (overrides the default)")
    ap.add_argument("--reps", type=int, default=2, help="runs per cell and system (default 2)")
    ap.add_argument("--systems", help="comma list: only these systems (e.g. nginx,varnish); "
                                      "the ceiling replays the first kept system's response")
    ap.add_argument("--no-build", action="store_true", help="use the existing larder binary")
    ap.add_argument("--no-write", action="store_true", help="print only; write no results files")
    ap.add_argument("--update-docs", action="store_true",
                    help="rewrite the results section of docs/benchmarks.md (implied by a full, "
                         "non-quick run of all scenarios)")
    ap.add_argument("--list", action="store_true",
                    help="list cells, their goals and the time plan, then exit")
    args = ap.parse_args()

    names = args.scenarios or list(SCENARIOS)
    # scenario push (bench/push_bench.py) runs subscribers, not wrk cells: on its own, after
    # the others.
    push = "push" in names
    tiers = "tiers" in names
    limits = "limits" in names
    names = [n for n in names if n not in ("push", "tiers", "limits")]
    for n in names:
        scenario_cells(n)  # validates
    duration = args.duration or (3 if args.quick else 10)
    est, nruns = plan_seconds(names, duration, args.reps, args)
    if not args.duration and not args.quick and est > SUITE_BUDGET_S:
        # keep the whole suite within its 15-minute budget
        runs = nruns * args.reps
        per = (SUITE_BUDGET_S - FIXED_OVERHEAD_S - nruns * PAIR_OVERHEAD_S) / runs - RUN_OVERHEAD_S
        duration = max(MIN_RUN_S, int(per))
        est, _ = plan_seconds(names, duration, args.reps, args)
        if est <= SUITE_BUDGET_S:
            log(f"bench: {nruns} cell/system pairs x {args.reps} runs: {duration}s per run "
                f"to stay within {SUITE_BUDGET_S // 60} min (use --duration 10 to force 10s)")
        else:
            log(f"bench: {nruns} cell/system pairs x {args.reps} runs: {duration}s per run, "
                f"the shortest it makes, does not fit {SUITE_BUDGET_S // 60} min "
                f"(use --reps 1, or name fewer scenarios)")
    log(f"bench: plan {nruns} cell/system pairs x {args.reps} runs x {duration}s, "
        f"about {est / 60:.1f} min of load (plus installs/builds)")
    if args.list:
        for name in names:
            for c in scenario_cells(name):
                systems = ", ".join(only_systems(c["systems"], args)) or "(none)"
                log(f"  {c['id']:19s} {c['conns']:>5} conns  {systems:37s} {c['label']}")
                for g in c["goals"]:
                    judged = g["target"] is not None or g["metric"] == "errors"
                    log(f"  {'':19s}   {'goal' if judged else 'info'}: {g['text']}")
        log("  (ceiling: bench/ceiling.c replaying, byte for byte, the response of the cell's "
            "first system, larder; hyper: examples/hyper_floor.rs, hyper and tokio alone; "
            "goals are judged on larder's figures)")
        return 0

    if not DATA.is_dir():
        raise SystemExit(f"bench data not found at {DATA}")
    for tool in ("nginx", "wrk", "taskset"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} missing: run bench/run, which installs it")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs at least 2 CPUs (server on CPU 0, wrk on CPU 1)")
    busy = [f"{n}:{p}" for n, p in PORTS.items() if port_busy(p)]
    if busy:
        raise SystemExit(f"ports already in use on 127.0.0.1: {', '.join(busy)}; "
                         "is another bench/run going? (this harness stops only what it started)")
    nofile = raise_nofile()
    if nofile < 10100:
        warn(f"RLIMIT_NOFILE is only {nofile}; the 10000-connection cells may fail")
    busy_pct = cpu_busy_pct()
    if busy_pct > 10:
        warn(f"the CPUs are {busy_pct:.0f}% busy before starting: other work on this machine "
             "skews the numbers")

    procs = Procs()
    env = Env(args, procs)
    env.busy_pct = busy_pct

    def on_signal(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    import atexit
    atexit.register(procs.stop_all)

    date = dt.date.today().isoformat()
    all_goals = []
    all_cells = []
    docs = []
    t_start = time.time()
    try:
        if names:
            env.start_origin()
        if any(n in ("pike", "piper", "pingap", "static-8k") for n in names) and \
                (not args.systems or "larder" in args.systems.split(",")):
            env.get("larder")  # build + start early so a skip is reported up front
        for name in names:
            t0 = time.time()
            cells = run_scenario(name, env, args, duration)
            versions = {s.name: s.version for s in env.systems.values()}
            for sname in list(env.systems):  # each scenario starts every server afresh
                env.stop(sname)
            doc = dict(scenario=name, date=date, started_at=dt.datetime.fromtimestamp(t0).isoformat(
                timespec="seconds"), elapsed_s=round(time.time() - t0), duration_s=duration,
                reps=args.reps, wrk_threads=WRK_THREADS, quick=args.quick,
                machine=machine_facts(env),
                versions=versions,
                skipped_systems={k: v for k, v in env.skipped.items()
                                 if any(k in c["systems"] for c in cells)},
                cells=cells)
            doc["goals"] = goals(name, cells)
            all_cells += cells
            all_goals += doc["goals"]
            md = markdown(doc)
            docs.append(md)
            log("\n" + md)
            if not args.no_write:
                RESULTS.mkdir(exist_ok=True)
                base = RESULTS / f"{date}-{name}"
                base.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
                base.with_suffix(".md").write_text(md + "\n")
                chart(doc, base.with_suffix(".png"))
                log(f"bench: wrote {base.relative_to(REPO)}.{{json,md,png}}")
        if push:
            import push_bench
            push_bench.run(procs, args)
        if tiers:
            import tiers_bench
            tiers_bench.run(procs, args)
        if limits:
            import limits_bench
            limits_bench.run(procs, args)
    except KeyboardInterrupt as e:
        warn(f"interrupted ({e}); stopping everything")
        return 130
    finally:
        procs.stop_all()
        env.cleanup()
    build_s = getattr(args, "build_s", 0)
    log(f"\nbench: done in {(time.time() - t_start) / 60:.1f} min"
        + (f" ({build_s / 60:.1f} min of it building larder)" if build_s else ""))
    noisy = [(d["id"], sname) for d in all_cells for sname, r in d["results"].items()
             if r.get("summary", {}).get("other_cpu_pct", 0) > 10]
    if noisy:
        warn(f"WARNING: {len(noisy)} cell/system results ran while other processes used more "
             "than 10% of the machine (column 'other CPU %'): re-run on an idle machine")
    if all_goals:
        met = sum(1 for g in all_goals if g["met"])
        judged = sum(1 for g in all_goals if g["met"] is not None)
        log(f"bench: goals met {met}/{judged} (of {len(all_goals)} goal rows; the rest are "
            "for information or not measurable)")
    full = set(names) == set(SCENARIOS) and not args.quick and not args.systems
    if not args.no_write and (args.update_docs or full):
        update_docs()
    return 0


if __name__ == "__main__":
    sys.exit(main())
