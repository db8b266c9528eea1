"""Running a cell: checking each system's response, then wrk (or h2load) runs with CPU and
RSS measured around them, summarized; the failover killer of the pools scenario.
"""

import gzip
import json
import os
import re
import resource
import subprocess
import tempfile
import threading
import time
import zlib
from pathlib import Path

from .common import (BACKGROUND_WAIT_S, BENCH, DATA, HOST, LOAD_CPU, SUT_CPU, TLS_PORTS, WARMUP_S,
                     WRK_THREADS, log, warn)
from .processes import CLK_TCK, busy_pct, cpu_busy_ticks, cpu_ticks, tree_cpu_ns
from .probes import http_req, image_format, jpeg_info, origin_requests
from .quality import describe, judge, measure, reference
from .scenarios import only_systems, scenario_cells
from .report import fmt_us


def _enc_ok(exp, enc):
    return enc in exp if isinstance(exp, tuple) else enc == exp


def check_response(cell, sysm, path, tries=12):
    """Warm the cache and check what the measured request gets: retried
    (about 3 s in all) until it is a 200, a hit where the cell needs one, and
    in the expected encoding, since a cache may compress its variants in the
    background after the first miss.

    Returns dict(ok, na, why, status, cache, encoding, length, ...)."""
    info, body = {}, b""
    exp = cell["expect_enc"]
    for i in range(tries):
        try:
            st, h, body = http_req(sysm.port, path, cell["headers"])
        except OSError as e:
            return dict(ok=False, na=False, why=f"request failed: {e}")
        info = dict(status=st, cache=h.get(sysm.cache_header) if sysm.cache_header else None,
                    encoding=h.get("content-encoding"), length=len(body),
                    content_type=h.get("content-type"), tries=i + 1)
        enc = (info["encoding"] or "").lower() or None
        needs_hit = cell["kind"] == "hit" or cell.get("cached")
        hit_ok = not needs_hit or (info["cache"] or "").upper() == "HIT"
        if st == 200 and hit_ok and _enc_ok(exp, enc):
            break
        time.sleep(0.05 * (i + 1))
    if info.get("status") != 200:
        return dict(info, ok=False, na=False, why=f"status {info.get('status')}")
    enc = (info["encoding"] or "").lower() or None
    if isinstance(exp, tuple):
        if enc not in exp:
            return dict(info, ok=False, na=True, why=f"served Content-Encoding {enc or 'identity'}")
    elif enc != exp:
        return dict(info, ok=False, na=True,
                    why=f"cannot serve {exp or 'identity'} (served {enc or 'identity'})")
    if enc == "gzip":
        try:
            info["decoded_length"] = len(gzip.decompress(body))
        except (OSError, EOFError, zlib.error) as e:
            return dict(info, ok=False, na=False, why=f"bad gzip body: {e}")
    if cell["kind"] == "hit" and (info["cache"] or "").upper() != "HIT":
        return dict(info, ok=True, na=False, hit=False,
                    why=f"{sysm.cache_header}: {info['cache']} after {tries} warm-up requests")
    if cell.get("cached") and (info["cache"] or "").upper() != "HIT":
        return dict(info, ok=True, na=False, hit=False,
                    why=f"{sysm.cache_header}: {info['cache']} after {tries} warm-up requests")
    if cell.get("transform") and not cell.get("cached") and \
            (info["cache"] or "").upper() == "HIT":
        return dict(info, ok=False, na=False,
                    why="served from its result cache in an uncached cell")
    if cell["kind"] == "image":
        fmt = image_format(body)
        want = (cell.get("transform") or {}).get("fmt", "jpeg")
        info["format"] = fmt
        if fmt != want:
            return dict(info, ok=False, na=False, why=f"response is {fmt or 'no image'}, not {want}")
        if fmt == "jpeg":
            ji = jpeg_info(body)
            info["jpeg"] = ji
            if ji and ji[:2] != (100, 100) and "transform" not in cell:
                info["note"] = f"output is {ji[0]}x{ji[1]}, {ji[2]} component(s)"
    return dict(info, ok=True, na=False, hit=cell["kind"] == "hit" or None, why="")


def run_wrk(port, path, conns, duration, headers, timeout_s, procs, sysm, origin_pid=None,
            tool="wrk"):
    scheme = "https" if port in TLS_PORTS else "http"
    url = f"{scheme}://{HOST}:{port}{path}"
    assert url.startswith(("http://127.0.0.1:", "https://127.0.0.1:")), url
    if tool == "h2load":
        # HTTP/2 over TLS: 10 streams per connection (-m10), one thread, for `duration`.
        argv = ["taskset", "-c", str(LOAD_CPU), "h2load", f"-c{conns}", "-m10", "-t1",
                "-D", str(duration)]
    else:
        argv = ["taskset", "-c", str(LOAD_CPU), "wrk", f"-t{WRK_THREADS}", f"-c{conns}",
                f"-d{duration}s", "--timeout", f"{timeout_s}s", "-s", str(BENCH / "latency.lua")]
    for k, v in headers.items():
        argv += ["-H", f"{k}: {v}"]
    argv.append(url)
    fd, name = tempfile.mkstemp(prefix="wrk-", suffix=".out",
                                dir=os.environ.get("LARDER_BENCH_TMP") or None)
    os.close(fd)
    out_path = Path(name)
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.5):
            peak[0] = max(peak[0], sysm.rss_kb())

    origin_before = origin_requests()
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    # CPU accounting. The server's own CPU time (all its processes and threads, ns:
    # tree_cpu_ns) over wrk's lifetime gives the server's CPU per request; work left
    # after wrk exits (closing its connections, abandoned requests) is not counted.
    # wrk's own CPU time comes from getrusage(RUSAGE_CHILDREN) once it is reaped.
    # And how much of the machine went to processes other than this run's (server,
    # origin, wrk): other work skews the numbers.
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    origin0 = tree_cpu_ns(origin_pid) if origin_pid else 0
    busy0, total0 = cpu_busy_ticks()
    # How busy each pinned CPU was (whoever ran there).
    sut0, load0 = cpu_ticks(SUT_CPU), cpu_ticks(LOAD_CPU)
    srv0 = sysm.cpu_ns()
    t0 = time.monotonic()
    p = procs.spawn("wrk", argv, out_path)
    try:
        p.wait(timeout=duration + 60)
    except subprocess.TimeoutExpired:
        warn(f"wrk did not finish within {duration + 60}s; killed")
    finally:
        srv1 = sysm.cpu_ns()
        wall = time.monotonic() - t0
        procs.stop(p)
        stop.set()
        th.join()
    busy1, total1 = cpu_busy_ticks()
    sut_pct, load_pct = busy_pct(sut0, cpu_ticks(SUT_CPU)), busy_pct(load0, cpu_ticks(LOAD_CPU))
    origin1 = tree_cpu_ns(origin_pid) if origin_pid else 0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wrk_s = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    server_s = max(0, srv1 - srv0) / 1e9
    ours_ticks = (server_s + max(0, origin1 - origin0) / 1e9 + wrk_s) * CLK_TCK
    other_pct = max(0.0, 100.0 * (busy1 - busy0 - ours_ticks) / max(1, total1 - total0))
    sysm.wait_idle()
    after = sysm.rss_kb()
    origin_after = origin_requests()
    out = out_path.read_text(errors="replace")
    out_path.unlink()
    r = parse_h2load(out, duration) if tool == "h2load" else None
    m = re.search(r"^WRKJSON (\{.*\})$", out, re.M)
    if r is None and not m:
        return dict(error=f"{tool} printed no result: "
                    + " | ".join(out.strip().splitlines()[-4:]))
    r = r or json.loads(m.group(1))
    secs = r["duration_us"] / 1e6 or duration
    good = r["requests"] - r["status"]
    delta = None
    if origin_before is not None and origin_after is not None:
        delta = origin_after - origin_before - 1  # minus the status request itself
    return dict(
        # req/s counts good answers only: wrk's requests include its
        # "Non-2xx or 3xx" ones (a 503 storm would otherwise look fast)
        rps=good / secs, rps_all=r["requests"] / secs,
        bytes_per_s=r["bytes"] / secs,
        p50_ms=r["p50_us"] / 1000, p90_ms=r["p90_us"] / 1000, p99_ms=r["p99_us"] / 1000,
        max_ms=r["max_us"] / 1000, requests=r["requests"],
        connect=r["connect"], read=r["read"], write=r["write"], timeout=r["timeout"],
        non2xx=r["status"], rss_peak_kb=max(peak[0], after), rss_after_kb=after,
        origin_requests=delta, other_cpu_pct=round(other_pct, 1), wrk=r,
        sut_cpu_pct=sut_pct, load_cpu_pct=load_pct,
        # the server's and wrk's own CPU time; the server's per good answer
        server_cpu_s=round(server_s, 6), wrk_cpu_s=round(wrk_s, 6), wall_s=round(wall, 3),
        cpu_us=server_s * 1e6 / good if good else None,
        server_cpu_pct=round(100.0 * server_s / wall, 1),
        wrk_cpu_pct=round(100.0 * wrk_s / wall, 1),
    )


def parse_h2load(out, duration):
    """h2load's summary in wrk's terms (latency percentiles: h2load gives min/mean/max/sd only,
    so p50 is its mean and p99 its max)."""
    fin = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s, ([\d.]+)([KMG]?B)/s", out)
    req = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                    r"(\d+) failed, (\d+) errored, (\d+) timeout", out)
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    lat = re.search(r"time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+"
                    r"([\d.]+)(us|ms|s)", out)
    if not (fin and req and codes):
        return None
    unit = {"us": 1, "ms": 1e3, "s": 1e6}
    secs = float(fin.group(1)) / (1000 if fin.group(2) == "ms" else 1)
    done = int(req.group(3))
    bps = float(fin.group(4)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[fin.group(5)[:-1]]
    mean_us = float(lat.group(5)) * unit[lat.group(6)] if lat else 0
    max_us = float(lat.group(3)) * unit[lat.group(4)] if lat else 0
    return dict(duration_us=secs * 1e6, requests=done,
                # 4xx and 5xx (h2load's 2xx count may include streams answered after "done").
                status=int(codes.group(3)) + int(codes.group(4)),
                bytes=bps * secs, p50_us=mean_us, p90_us=mean_us, p99_us=max_us, max_us=max_us,
                connect=int(req.group(6)), read=0, write=0, timeout=int(req.group(7)))


def summarize(runs):
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return dict(error=runs[0].get("error", "no runs") if runs else "no runs")
    mean = lambda k: sum(r[k] for r in ok) / len(ok)  # noqa: E731
    s = dict(rps=mean("rps"), bytes_per_s=mean("bytes_per_s"), p50_ms=mean("p50_ms"),
             p99_ms=mean("p99_ms"), rps_runs=[round(r["rps"]) for r in ok])
    for k in ("connect", "read", "write", "timeout", "non2xx", "requests"):
        s[k] = sum(r[k] for r in ok)
    s["other_cpu_pct"] = max(r.get("other_cpu_pct", 0) for r in ok)
    for k in ("sut_cpu_pct", "load_cpu_pct", "server_cpu_pct", "wrk_cpu_pct"):
        s[k] = round(sum(r.get(k, 0) for r in ok) / len(ok))
    # server CPU per good answer over all runs (not a mean of the runs' ratios)
    good = sum(r["requests"] - r["non2xx"] for r in ok)
    s["cpu_us"] = sum(r["server_cpu_s"] for r in ok) * 1e6 / good if good else None
    s["cpu_us_runs"] = [None if r["cpu_us"] is None else round(r["cpu_us"], 2) for r in ok]
    s["rss_peak_kb"] = max(r["rss_peak_kb"] for r in ok)
    if any("eject_s" in r for r in ok):
        s["eject_s"] = [r.get("eject_s") for r in ok]
    s["rss_after_kb"] = ok[-1]["rss_after_kb"]
    o = [r["origin_requests"] for r in ok if r["origin_requests"] is not None]
    s["origin_requests"] = sum(o) if o else None
    return s


def run_scenario(name, env, args, duration):
    cells = scenario_cells(name)
    for c in cells:
        c["systems"] = only_systems(c["systems"], args)
    log(f"\n=== scenario {name}: {len(cells)} cells, {args.reps} runs each, {duration}s per run ===")
    timeout_s = 10 if name in ("zimg", "imgproxy") else 2
    results = []
    for cell in cells:
        log(f"--- {cell['id']}: {cell['label']} @ {cell['conns']} conns")
        res = {}
        active = []
        for sname in cell["systems"]:
            if sname == "ceiling":
                # replays what the first system that passed its check (larder) sent
                if not active:
                    res[sname] = dict(skipped="no system in this cell answered: "
                                              "no response to replay")
                    log(f"    {sname:13s} SKIPPED: {res[sname]['skipped']}")
                    continue
                sysm, why = env.start_ceiling(cell, active[0][1], active[0][2])
                if sysm is None:
                    res[sname] = dict(skipped=why)
                    log(f"    {sname:13s} SKIPPED: {why}")
                    continue
                log(f"    {sname:13s} replays {sysm.replays['system']}'s response "
                    f"({sysm.replays['head_bytes']} B head, "
                    f"{sysm.replays['bytes'] - sysm.replays['head_bytes']:,} B body"
                    f"{', sent with sendfile' if sysm.replays.get('sendfile') else ''})")
            else:
                sysm = env.get(sname)
            if sysm is None:
                res[sname] = dict(skipped=env.skipped.get(sname, "not started"))
                continue
            path = image_path(cell["paths"][sname], sysm)
            chk = check_response(cell, sysm, path)
            res[sname] = dict(path=path, check=chk, runs=[])
            if sname == "ceiling":
                res[sname]["replays"] = sysm.replays
            if chk.get("na"):
                res[sname]["na"] = chk["why"]
                log(f"    {sname:13s} n/a: {chk['why']}")
            elif not chk["ok"]:
                res[sname]["skipped"] = f"check failed: {chk['why']}"
                log(f"    {sname:13s} SKIPPED, check failed: {chk['why']}")
            else:
                if chk.get("hit") is False:
                    log(f"    {sname:13s} WARNING: not a cache hit: {chk['why']}")
                active.append((sname, sysm, path))
        if cell.get("transform") and not cell.get("cached"):
            measure_quality(cell, res, active)
        for sname, sysm, path in active:
            # The check may have just stored the body, and a cache may compress its variants in
            # the background (larder's br and zstd of a 10 MB body at levels 11 and 19: tens of
            # seconds of CPU): wait for that to end, or the runs' CPU per request counts it.
            t0 = time.monotonic()
            idle = sysm.wait_idle(limit=BACKGROUND_WAIT_S)
            waited = time.monotonic() - t0
            res[sname]["background_s"] = round(waited, 1)
            if not idle:
                res[sname]["background_busy"] = True
                log(f"    {sname:13s} WARNING: still busy after {waited:.0f} s of background "
                    "work (compression?): its CPU per request includes it")
            elif waited > 1:
                log(f"    {sname:13s} waited {waited:.1f} s for background work (compression)")
        for sname, sysm, path in active:  # 1 s unrecorded warm-up at the cell's concurrency
            run_wrk(sysm.port, path, cell["conns"], WARMUP_S, cell["headers"], timeout_s,
                    env.procs, sysm, tool=cell.get("tool", "wrk"))
            time.sleep(1.0 if cell["conns"] >= 1000 else 0.2)
        for rep in range(args.reps):
            for sname, sysm, path in active:
                killer = failover_killer(env, cell, sysm, path, duration)
                r = run_wrk(sysm.port, path, cell["conns"], duration, cell["headers"],
                            timeout_s, env.procs, sysm, env.origin_pid,
                            tool=cell.get("tool", "wrk"))
                if killer:
                    killer.join()
                    r["eject_s"] = killer.eject_s
                    log(f"    {sname:13s} run {rep + 1}: backend killed; "
                        + (f"ejected after {killer.eject_s * 1000:.0f} ms"
                           if killer.eject_s is not None else "ejection not observable"))
                res[sname]["runs"].append(r)
                if "error" in r:
                    log(f"    {sname:13s} run {rep + 1}: ERROR {r['error']}")
                else:
                    log(f"    {sname:13s} run {rep + 1}: {r['rps']:>10,.0f} req/s  "
                        f"p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:8.2f} ms  "
                        f"err c/r/w/t {r['connect']}/{r['read']}/{r['write']}/{r['timeout']}  "
                        f"non2xx {r['non2xx']}  origin {r['origin_requests']}  "
                        f"rss {r['rss_after_kb'] / 1024:.1f} MiB  other CPU {r['other_cpu_pct']:.0f}%  "
                        f"server {fmt_us(r['cpu_us'])} us/req  own CPU server/wrk "
                        f"{r['server_cpu_pct']:.0f}/{r['wrk_cpu_pct']:.0f}%  "
                        f"CPU0/CPU1 {r['sut_cpu_pct']:.0f}/{r['load_cpu_pct']:.0f}%")
                time.sleep(1.0 if cell["conns"] >= 1000 else 0.2)
        for sname, sysm, path in active:
            res[sname]["summary"] = summarize(res[sname]["runs"])
            if cell["kind"] == "hit":
                after = check_response(dict(cell, kind="hit"), sysm, path, tries=1)
                res[sname]["check_after"] = after
        if cell.get("transform") and not cell.get("cached"):
            log(f"    {quality_line(res)}")
        results.append(dict(cell, results=res))
    return results


def image_path(path, sysm):
    """A cell's path with the md5 of each source larder-img was given filled in
    (@@MD5:file@@; @@MD5@@ the first)."""
    for src, md5 in getattr(sysm, "md5s", {}).items():
        path = path.replace(f"@@MD5:{src}@@", md5)
    return path.replace("@@MD5@@", getattr(sysm, "md5", ""))


def measure_quality(cell, res, active):
    """One output of each system that passed its check, against the float reference of the
    cell's transform (bench/lib/quality.py): res[system]["quality"] = dict(ssim, bytes, ...)."""
    t = cell["transform"]
    src = (DATA / t["src"]).read_bytes()
    try:
        ref = reference(src, t["mode"], t["w"], t["h"])
    except ImportError as e:
        ref = None
        why = f"not measured: {e.name} missing from bench/.venv"
    for sname, sysm, path in active:
        if ref is None:
            res[sname]["quality"] = dict(error=why)
            continue
        st, _, body = http_req(sysm.port, path, cell["headers"])
        q = measure(src, body, t["mode"], t["w"], t["h"], ref) if st == 200 else \
            dict(error=f"status {st}")
        res[sname]["quality"] = q


def quality_line(res):
    """larder against the anchor: req/s and CPU per request ratios, each output's SSIM and bytes,
    and the quality goal (SSIM >= the anchor's - 0.005 at <= 1.05x its bytes)."""
    def s(name):
        r = res.get(name) or {}
        return r.get("summary") if r.get("summary") and "error" not in r["summary"] else None

    def q(name):
        qq = (res.get(name) or {}).get("quality") or {}
        if "ssim" in qq:
            return f"{name} {describe(qq)}"
        why = qq.get("error") or (res.get(name) or {}).get("skipped") or "not measured"
        return f"{name} quality {why}"

    lname, anchor = "larder-img", "imgproxy"
    parts = []
    ls, as_ = s(lname), s(anchor)
    if ls and as_ and as_["rps"]:
        parts.append(f"larder/imgproxy {ls['rps'] / as_['rps']:.2f}x req/s "
                     f"({ls['rps']:,.0f} against {as_['rps']:,.0f}), CPU per request "
                     f"{fmt_us(ls['cpu_us'])} against {fmt_us(as_['cpu_us'])} µs")
    else:
        parts.append("larder/imgproxy req/s: no ratio (" + ", ".join(
            f"{n}: {(res.get(n) or {}).get('skipped') or 'not measured'}"
            for n, x in ((lname, ls), (anchor, as_)) if not x) + ")")
    parts += [q(lname), q(anchor)]
    met, _ = judge((res.get(lname) or {}).get("quality") or {},
                   (res.get(anchor) or {}).get("quality") or {})
    parts.append("goal: >= imgproxy-0.005 at <=1.05x bytes: "
                 + {True: "met", False: "NOT MET", None: "not judged"}[met])
    return "; ".join(parts)


# Passive ejection lasts this long in both failover pools (larder's default fail_timeout,
# nginx's fail_timeout=10s): a backend started again is probed after it.
FAIL_TIMEOUT_S = 10


def failover_killer(env, cell, sysm, path, duration):
    """For a cell with kill_at: starts origin-b again, waits out any ejection left from the
    previous run (so both systems start with three healthy backends), then returns a started
    thread that kills origin-b kill_at into the run and, where the system says (larder's
    admin API), times how long until the backend is out (its .eject_s)."""
    if not cell.get("kill_at"):
        return None
    env.start_origin_b()
    time.sleep(FAIL_TIMEOUT_S + 1)
    for _ in range(12):  # the probe after an ejection, and connections to each backend
        try:
            http_req(sysm.port, path, cell["headers"], timeout=2)
        except OSError:
            pass
    probe = env.failover_probe(sysm)

    class Killer(threading.Thread):
        eject_s = None

        def run(self):
            time.sleep(duration * cell["kill_at"])
            env.kill_origin_b()
            t = time.monotonic()
            while probe and time.monotonic() - t < duration:
                if probe():
                    self.eject_s = time.monotonic() - t
                    return
                time.sleep(0.005)

    k = Killer(daemon=True)
    k.start()
    return k
