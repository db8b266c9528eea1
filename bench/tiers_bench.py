"""Scenario tiers (bench/run tiers): the cache tiers below memory, side by side in one run.

1. **disk-tier hits** against nginx's proxy_cache (which serves every hit from its files): 20,000
   objects of 8 KiB (160 MiB) requested at random, larder's memory tier bounded to 32 MiB, so
   most hits come from the disk tier; both warmed with every object first, and that filling is
   timed too (misses a second on one connection; how soon larder's disk tier has written every
   object: tests/tiers.rs checks only that filling happens, not how fast). Both read through
   the page cache (24 GiB here): this measures what each spends per disk hit, not the drive.
2. **shared-tier hits** (larder's memory bounded to 64 KiB, every hit read from Redis) against
   memory hits (the same larder with room for all) and origin fetches (the route's cache off),
   2,000 objects of 8 KiB at random: p50/p99 latency at 20 connections.
3. **purge propagation**: three larder nodes on one Redis, each holding a URL; a PURGE on the
   first; the time until the two others no longer hold it (polled every millisecond with
   `Cache-Control: only-if-cached`), over 30 URLs.

Servers run on CPU 0, wrk, the origin (nginx serving files) and redis-server on CPU 1. The disk
cell runs larder, nginx, larder, nginx and reports each over both of its runs (req/s and CPU per
request over all requests, mean p50, worst p99; the runs themselves are in the JSON and the
markdown); the other cells one run per system. Reports req/s, p50/p99, and the server's CPU per
request.
"""

import datetime as dt
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import lib as H

PORT_ORIGIN, PORT_LARDER, PORT_NGINX, PORT_REDIS = 18300, 18301, 18302, 18303
PORT_NODES = [18311, 18312, 18313]
HOST_HDR = "bench.tiers"
OBJECTS, SIZE = 20_000, 8192
SHARED_OBJECTS = 2_000
DURATION = 10
DISK_ROUNDS = 2  # larder, nginx, larder, nginx

ORIGIN_CONF = """worker_processes 1;
pid {tmp}/origin.pid;
error_log {tmp}/origin-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/o-body; proxy_temp_path {tmp}/o-proxy;
  fastcgi_temp_path {tmp}/o-fcgi; uwsgi_temp_path {tmp}/o-uwsgi; scgi_temp_path {tmp}/o-scgi;
  default_type application/octet-stream;
  server {{
    listen 127.0.0.1:{port};
    root {tmp}/objs;
    location / {{ add_header Cache-Control "max-age=86400"; }}
  }}
}}
"""

NGINX_CONF = """worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; use epoll; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/n-body; proxy_temp_path {tmp}/n-proxy;
  fastcgi_temp_path {tmp}/n-fcgi; uwsgi_temp_path {tmp}/n-uwsgi; scgi_temp_path {tmp}/n-scgi;
  proxy_cache_path {tmp}/nginx-cache levels=1:2 keys_zone=disk:32m max_size=1g inactive=1d
                   use_temp_path=off;
  upstream origin {{ server 127.0.0.1:{origin}; keepalive 32; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_cache disk;
      proxy_cache_valid 200 1d;
      add_header X-Cache $upstream_cache_status;
    }}
  }}
}}
"""

LARDER_CONF = """[server]
workers = 1
[admin]
listen = "127.0.0.1:{admin}"
token = "bench"
[cache]
max_size = "{memory}"
max_object_size = "64KiB"
{tiers}
[[listener]]
addr = "127.0.0.1:{port}"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "http://127.0.0.1:{origin}", cache = {cache} }}
"""

RANDOM_LUA = """-- wrk: GET /o/<random object> (bench/tiers_bench.py), results as latency.lua prints them
dofile("{latency}")
math.randomseed(42)
local n = {n}
request = function()
  return wrk.format(nil, "/o/" .. math.random(0, n - 1) .. ".bin")
end
"""


def make_objects(tmp):
    objs = tmp / "objs" / "o"
    objs.mkdir(parents=True)
    for i in range(OBJECTS):
        # Distinct bytes per object (the first 16 name it), random-looking rest.
        body = (f"{i:016d}".encode() + os.urandom(SIZE - 16))
        (objs / f"{i}.bin").write_bytes(body)


def up(port, path, proc):
    ok, why = H.wait_http(port, path, proc=proc)
    if not ok:
        raise SystemExit(f"tiers: nothing on port {port}: {why}")


def larder_conf(tmp, name, port, admin, memory, tiers="", cache="true"):
    conf = tmp / f"{name}.toml"
    conf.write_text(LARDER_CONF.format(port=port, admin=admin, memory=memory, tiers=tiers,
                                       cache=cache, origin=PORT_ORIGIN))
    return conf


def start_larder(procs, binary, tmp, name, port, admin, memory, tiers="", cache="true", cpu=0):
    conf = larder_conf(tmp, name, port, admin, memory, tiers, cache)
    p = procs.spawn(name, [str(binary), "--config", str(conf)], tmp / f"{name}.log", cpu=cpu)
    up(port, "/", p)
    return p


def warm(port, n, conns=1):
    """Requests every object once (keep-alive)."""
    c = http.client.HTTPConnection(H.HOST, port, timeout=30)
    for i in range(n):
        c.request("GET", f"/o/{i}.bin", headers={"Host": HOST_HDR})
        r = c.getresponse()
        r.read()
        if r.status != 200:
            raise SystemExit(f"warming {port}: /o/{i}.bin answered {r.status}")
    c.close()


def tier_counts(admin):
    c = http.client.HTTPConnection(H.HOST, admin, timeout=10)
    c.request("GET", "/_larder/status", headers={"Authorization": "Bearer bench"})
    doc = json.loads(c.getresponse().read())
    return {t["tier"]: t for t in doc["cache"].get("tiers", [])}


def wrk(tmp, port, n, conns, pids):
    lua = tmp / f"random-{n}.lua"
    lua.write_text(RANDOM_LUA.format(latency=H.BENCH / "latency.lua", n=n))
    cpu0 = sum(H.tree_cpu_ns(p) for p in pids)
    out = subprocess.run(["taskset", "-c", str(H.LOAD_CPU), "wrk", "-t1", f"-c{conns}",
                          f"-d{DURATION}s", "--timeout", "5s", "-s", str(lua),
                          "-H", f"Host: {HOST_HDR}", f"http://{H.HOST}:{port}/"],
                         capture_output=True, text=True, timeout=DURATION + 60).stdout
    cpu1 = sum(H.tree_cpu_ns(p) for p in pids)
    m = re.search(r"^WRKJSON (\{.*\})$", out, re.M)
    if not m:
        return dict(error="wrk printed no result: " + out.strip()[-300:])
    r = json.loads(m.group(1))
    good = r["requests"] - r["status"]
    secs = r["duration_us"] / 1e6
    errors = r["connect"] + r["read"] + r["write"] + r["timeout"] + r["status"]
    return dict(rps=good / secs, p50_ms=r["p50_us"] / 1000, p99_ms=r["p99_us"] / 1000,
                errors=errors, cpu_us=(cpu1 - cpu0) / 1000 / max(good, 1), requests=good,
                secs=secs, cpu_ns=cpu1 - cpu0)


def combine(runs):
    """One figure from interleaved runs of one system: req/s and CPU per request over all of
    them, the mean p50, the worst p99; each run kept under "runs"."""
    if any("error" in r for r in runs):
        return next(r for r in runs if "error" in r)
    good = sum(r["requests"] for r in runs)
    return dict(rps=good / sum(r["secs"] for r in runs),
                p50_ms=statistics.mean(r["p50_ms"] for r in runs),
                p99_ms=max(r["p99_ms"] for r in runs), errors=sum(r["errors"] for r in runs),
                cpu_us=sum(r["cpu_ns"] for r in runs) / 1000 / max(good, 1), requests=good,
                runs=[{k: r[k] for k in ("rps", "cpu_us", "p50_ms", "p99_ms")} for r in runs])


def line(name, r):
    if "error" in r:
        return f"    {name:16s} ERROR {r['error']}"
    return (f"    {name:16s} {r['rps']:>9,.0f} req/s  p50 {r['p50_ms']:6.2f} ms  "
            f"p99 {r['p99_ms']:6.2f} ms  {r['cpu_us']:6.1f} µs CPU/req  errors {r['errors']}")


def disk_cell(procs, binary, tmp):
    H.log(f"--- tiers: disk-tier hits, {OBJECTS:,} x {SIZE // 1024} KiB at random, 50 connections")
    res = {}
    n = procs.spawn("nginx", ["nginx", "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"],
                    tmp / "nginx.log", cpu=0)
    up(PORT_NGINX, "/o/0.bin", n)
    disk = f'[cache.disk]\ndir = "{tmp}/larder-disk"\nmax_size = "1GiB"\n'
    lp = start_larder(procs, binary, tmp, "larder-disk", PORT_LARDER, 18331, "32MiB", disk)
    # Filling (every request a miss fetched from the origin and stored; one connection): misses
    # a second, and for larder how soon its disk tier has written every object. tests/tiers.rs
    # only checks that a load ran before its kill; the rate is measured here.
    fill = {}
    t0 = time.time()
    warm(PORT_NGINX, OBJECTS)
    fill["nginx"] = dict(fill_rps=OBJECTS / (time.time() - t0))
    t0 = time.time()
    warm(PORT_LARDER, OBJECTS)
    fill["larder"] = dict(fill_rps=OBJECTS / (time.time() - t0))
    deadline = time.time() + 60
    while tier_counts(18331)["disk"]["writes"] < OBJECTS and time.time() < deadline:
        time.sleep(0.5)
    if tier_counts(18331)["disk"]["writes"] >= OBJECTS:
        fill["larder"]["disk_written_s"] = time.time() - t0  # within the 0.5 s poll
    for k, f in fill.items():
        H.log(f"    {k:16s} fill {f['fill_rps']:>9,.0f} misses/s"
              + (f"  (all {OBJECTS:,} on disk after {f['disk_written_s']:.1f} s)"
                 if "disk_written_s" in f else ""))
    time.sleep(2)  # the writes are counted once written; let the machine settle
    before = tier_counts(18331)["disk"]
    runs = {"larder": [], "nginx": []}
    for _ in range(DISK_ROUNDS):  # interleaved: a slow moment of the machine hits both
        runs["larder"].append(wrk(tmp, PORT_LARDER, OBJECTS, 50, [lp.pid]))
        runs["nginx"].append(wrk(tmp, PORT_NGINX, OBJECTS, 50, [n.pid]))  # with its workers
    after = tier_counts(18331)["disk"]
    res = {k: dict(combine(v), **fill[k]) for k, v in runs.items()}
    hits = after["hits"] - before["hits"]
    res["larder"]["disk_hit_share"] = hits / max(res["larder"].get("requests", 1), 1)
    for k, r in res.items():
        H.log(line(k, r) + (f"  ({r['disk_hit_share']:.0%} from the disk tier)"
                            if "disk_hit_share" in r else ""))
    procs.stop(lp)
    procs.stop(n)
    return res


def shared_cell(procs, binary, tmp):
    H.log(f"--- tiers: shared-tier hits vs memory hits vs origin fetches, "
          f"{SHARED_OBJECTS:,} x {SIZE // 1024} KiB, 20 connections")
    res = {}
    shared = f'[cache.shared]\nurl = "redis://127.0.0.1:{PORT_REDIS}"\n'
    runs = [("memory hit", "1GiB", "", "true"), ("shared-tier hit", "64KiB", shared, "true"),
            ("origin fetch", "1GiB", "", "false")]
    for name, memory, tiers, cache in runs:
        p = start_larder(procs, binary, tmp, "larder-" + name.split()[0], PORT_LARDER, 18332,
                         memory, tiers, cache)
        warm(PORT_LARDER, SHARED_OBJECTS)
        res[name] = wrk(tmp, PORT_LARDER, SHARED_OBJECTS, 20, [p.pid])
        if tiers:
            res[name]["shared"] = tier_counts(18332).get("shared")
        H.log(line(name, res[name]))
        procs.stop(p)
    return res


def purge_cell(procs, binary, tmp):
    H.log("--- tiers: purge propagation across 3 nodes")
    shared = f'[cache.shared]\nurl = "redis://127.0.0.1:{PORT_REDIS}"\n'
    nodes = [start_larder(procs, binary, tmp, f"node{i}", port, 18340 + i, "64MiB", shared,
                          cpu=i % 2)
             for i, port in enumerate(PORT_NODES)]
    conns = [http.client.HTTPConnection(H.HOST, p, timeout=10) for p in PORT_NODES]

    def get(c, path, cached_only=False):
        h = {"Host": HOST_HDR}
        if cached_only:
            h["Cache-Control"] = "only-if-cached"
        c.request("GET", path, headers=h)
        r = c.getresponse()
        r.read()
        return r.status

    times = []
    for k in range(30):
        path = f"/o/{k}.bin"
        for c in conns:
            get(c, path)
        for c in conns[1:]:
            assert get(c, path, True) == 200
        conns[0].request("PURGE", path, headers={"Host": HOST_HDR, "Authorization": "Bearer bench"})
        conns[0].getresponse().read()
        t0 = time.monotonic()
        pending = set(range(1, len(conns)))
        while pending and time.monotonic() - t0 < 5:
            for i in list(pending):
                if get(conns[i], path, True) == 504:
                    pending.discard(i)
                    times.append((time.monotonic() - t0) * 1000)
            time.sleep(0.001)
        if pending:
            times.append(float("inf"))
    for p in nodes:
        procs.stop(p)
    res = dict(samples=len(times), median_ms=statistics.median(times), max_ms=max(times))
    H.log(f"    purge reached the other nodes: median {res['median_ms']:.1f} ms, "
          f"max {res['max_ms']:.1f} ms ({res['samples']} samples)")
    return res


def table(out, results, label, extra=lambda r: ""):
    """Rows of `results` (name -> wrk result) under a header whose first column is `label`."""
    out += [f"| {label} | req/s | p50 ms | p99 ms | server CPU µs/req | errors |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for k, r in results.items():
        if "error" in r:
            out.append(f"| {k} | error: {r['error']} | | | | |")
        else:
            out.append(f"| {k}{extra(r)} | {r['rps']:,.0f} | {r['p50_ms']:.2f} | "
                       f"{r['p99_ms']:.2f} | {r['cpu_us']:.1f} | {r['errors']} |")


def markdown(doc):
    p = doc["purge"]
    out = [f"### tiers ({doc['date']})", "",
           f"Disk-tier hits: {OBJECTS:,} objects of {SIZE // 1024} KiB at random, 50 connections, "
           "larder's memory 32 MiB (the rest from its disk tier) against nginx proxy_cache.", ""]
    table(out, doc["disk"], "system",
          lambda r: f" ({r['disk_hit_share']:.0%} disk hits)" if "disk_hit_share" in r else "")
    each = [f"{name} " + " and ".join(f"{r['rps']:,.0f} req/s at {r['cpu_us']:.1f} µs"
                                     for r in res["runs"])
            for name, res in doc["disk"].items() if "runs" in res]
    if each:
        out += ["", f"Interleaved runs, in order: {'; '.join(each)}."]
    filled = [f"{name} {r['fill_rps']:,.0f} misses/s"
              + (f" (its disk tier had written all {OBJECTS:,} after {r['disk_written_s']:.1f} s)"
                 if "disk_written_s" in r else "")
              for name, r in doc["disk"].items() if "fill_rps" in r]
    if filled:
        out += ["", f"Filling first (one connection, every request a miss stored): "
                f"{'; '.join(filled)}."]
    out += ["", f"Shared tier: {SHARED_OBJECTS:,} objects of {SIZE // 1024} KiB at random, "
            "20 connections, one larder (memory 64 KiB for shared-tier hits).", ""]
    table(out, doc["shared"], "served as")
    out += ["", f"Purge propagation across 3 nodes: median {p['median_ms']:.1f} ms, max "
            f"{p['max_ms']:.1f} ms over {p['samples']} samples.", ""]
    for g in doc["goals"]:
        out.append(f"- {g['text']}: {g['value']} ({'met' if g['met'] else 'NOT met'})")
    return "\n".join(out)


def goals(doc):
    out = []
    d, s = doc["disk"], doc["shared"]
    if "rps" in d.get("larder", {}) and "rps" in d.get("nginx", {}):
        ratio = d["larder"]["rps"] / d["nginx"]["rps"]
        eff = d["nginx"]["cpu_us"] / d["larder"]["cpu_us"]
        out.append(dict(text="disk-tier hits >= 1.3x nginx proxy_cache (req/s)",
                        value=f"{ratio:.2f}x req/s, {eff:.2f}x CPU efficiency", met=ratio >= 1.3))
    if "p99_ms" in s.get("shared-tier hit", {}) and "p99_ms" in s.get("memory hit", {}):
        ratio = s["shared-tier hit"]["p99_ms"] / s["memory hit"]["p99_ms"]
        out.append(dict(text="shared-tier hit p99 within 2x a memory hit's",
                        value=f"{ratio:.2f}x", met=ratio <= 2.0))
    out.append(dict(text="purge reaches every node within 1 s",
                    value=f"max {doc['purge']['max_ms']:.1f} ms",
                    met=doc["purge"]["max_ms"] <= 1000))
    return out


def run(procs, args):
    # A stray server on one of these ports would be measured in place of the one started here.
    ports = [PORT_ORIGIN, PORT_LARDER, PORT_NGINX, PORT_REDIS, 18331, 18332, *PORT_NODES]
    busy = [str(p) for p in ports if H.port_busy(p)]
    if busy:
        H.warn(f"tiers: ports already in use on 127.0.0.1: {', '.join(busy)}")
        return 1
    tmp = Path(os.environ.get("LARDER_BENCH_TMP") or "/tmp") / "tiers"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    binary = H.build_larder(args)
    if isinstance(binary, str):
        H.warn(f"tiers: larder not built: {binary}")
        return 1
    make_objects(tmp)
    (tmp / "origin.conf").write_text(ORIGIN_CONF.format(tmp=tmp, port=PORT_ORIGIN))
    (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, port=PORT_NGINX,
                                                      origin=PORT_ORIGIN))
    origin = procs.spawn("origin", ["nginx", "-c", str(tmp / "origin.conf"), "-g", "daemon off;"],
                         tmp / "origin.log", cpu=H.LOAD_CPU)
    up(PORT_ORIGIN, "/o/0.bin", origin)
    redis = procs.spawn("redis", ["redis-server", "--port", str(PORT_REDIS), "--bind", "127.0.0.1",
                                  "--save", "", "--appendonly", "no"],
                        tmp / "redis.log", cpu=H.LOAD_CPU)
    time.sleep(0.5)
    try:
        doc = dict(scenario="tiers", date=dt.date.today().isoformat(),
                   disk=disk_cell(procs, binary, tmp),
                   shared=shared_cell(procs, binary, tmp),
                   purge=purge_cell(procs, binary, tmp))
    finally:
        procs.stop(redis)
        procs.stop(origin)
    doc["goals"] = goals(doc)
    H.write_results(doc, markdown(doc), args)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0
