"""Scenario limits (bench/run limits): how exactly a rate limit holds under load (issue #41).

1. **one node**: larder answering a fixed response on a route with `rate_limit = { rate =
   "100/s", burst = 0 }` per client address; wrk offers as many requests as it can (one key: the
   test's one address) for 10 s. The requests let through against what the limit allows: a
   full bucket (`100/s` is up to 100 in any second: 100 at once) and then 100 a second for the
   run's length: within ±2%.
2. **two nodes, one fleet limit**: the same limit with `fleet = true` on two larder nodes
   sharing a redis-server (`[cache.shared]`): one decision a request in Redis (one Lua script);
   two wrk at once, one a node. The requests both let through against the one limit: within
   ±5%.

Servers run on CPU 0, wrk and redis-server on CPU 1. Reports the requests offered a second (what
wrk reached), the requests let through, their ratio to the limit, and the server's CPU per
request (a refused request costs what the limit's decision costs). The memory of a million keys
is measured by a unit test (`cargo test --lib a_million_keys -- --nocapture`,
docs/design.md "Limits").
"""

import datetime as dt
import os
import json
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import lib as H

PORT_REDIS = 18403
PORT_NODES = [18401, 18402]
RATE = 100
DURATION = 10

CONF = """[server]
workers = 1
{shared}
[[listener]]
addr = "127.0.0.1:{port}"
  [[listener.route]]
  path = "/"
  respond = {{ body = "ok" }}
    [[listener.route.rule]]
    name = "bench"
    rate_limit = {{ rate = "{rate}/s", burst = 0, key = "client", fleet = {fleet} }}
"""


def start(procs, binary, tmp, port, fleet):
    shared = (f'[cache.shared]\nurl = "redis://127.0.0.1:{PORT_REDIS}"\ntimeout = "50ms"\n'
              if fleet else "")
    conf = tmp / f"larder-{port}.toml"
    conf.write_text(CONF.format(shared=shared, port=port, rate=RATE,
                                fleet="true" if fleet else "false"))
    p = procs.spawn(f"larder-{port}", [str(binary), "--config", str(conf)],
                    tmp / f"larder-{port}.log", cpu=H.SUT_CPU)
    ok, why = H.wait_http(port, "/", timeout=15, proc=p)
    if not ok:
        raise RuntimeError(f"larder on {port} did not start: {why}")
    return p


def wrk(port, out, i):
    r = subprocess.run(["taskset", "-c", str(H.LOAD_CPU), "wrk", "-t1", "-c50",
                        f"-d{DURATION}s", "--timeout", "5s", "-s", str(H.BENCH / "latency.lua"),
                        f"http://{H.HOST}:{port}/"],
                       capture_output=True, text=True, timeout=DURATION + 60).stdout
    m = re.search(r"^WRKJSON (\{.*\})$", r, re.M)
    out[i] = json.loads(m.group(1)) if m else dict(error=r.strip()[-300:])


def cell(procs, binary, tmp, nodes, fleet):
    servers = [start(procs, binary, tmp, port, fleet) for port in PORT_NODES[:nodes]]
    pids = [p.pid for p in servers]
    # The start-up probes took from the bucket (and, with a fleet, from Redis's): a second
    # and a half fills it again.
    time.sleep(1.5)
    cpu0 = sum(H.tree_cpu_ns(p) for p in pids)
    res = [None] * nodes
    threads = [threading.Thread(target=wrk, args=(PORT_NODES[i], res, i)) for i in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1 = sum(H.tree_cpu_ns(p) for p in pids)
    for p in servers:
        procs.stop(p)
    if any("error" in r for r in res):
        return dict(error="; ".join(r["error"] for r in res if "error" in r))
    secs = max(r["duration_us"] for r in res) / 1e6
    offered = sum(r["requests"] for r in res)
    allowed = sum(r["requests"] - r["status"] for r in res)
    errors = sum(r["connect"] + r["read"] + r["write"] + r["timeout"] for r in res)
    # `rate = "100/s"` is up to 100 requests in any second: a full bucket lets 100 through at
    # once, then 100 a second.
    expected = RATE * (secs + 1)
    return dict(nodes=nodes, fleet=fleet, secs=secs, offered_rps=offered / secs,
                allowed=allowed, expected=expected, ratio=allowed / expected, errors=errors,
                cpu_us=(cpu1 - cpu0) / 1000 / max(offered, 1))


def markdown(doc):
    out = [f"### limits ({doc['date']})", "",
           f"A rate limit of {RATE} requests a second per client address, {DURATION} s of as many "
           "requests as wrk offers (50 connections a node).", "",
           "| cell | offered req/s | let through | the limit allows | ratio | CPU per request |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in doc["cells"].items():
        if "error" in r:
            out.append(f"| {name} | error: {r['error']} | | | | |")
            continue
        out.append(f"| {name} | {r['offered_rps']:,.0f} | {r['allowed']:,} | "
                   f"{r['expected']:,.0f} | {r['ratio']:.3f} | {r['cpu_us']:.1f} µs |")
    out.append("")
    for g in doc["goals"]:
        out.append(f"- {g['text']}: {g['value']} ({'met' if g['met'] else 'NOT met'})")
    return "\n".join(out)


def goals(doc):
    out = []
    for name, tol, offered in (("one node", 0.02, 20000), ("two nodes, fleet", 0.05, None)):
        r = doc["cells"].get(name, {})
        if "ratio" not in r:
            continue
        out.append(dict(text=f"{name}: requests let through within ±{tol:.0%} of the limit",
                        value=f"{r['ratio']:.3f}", met=abs(r["ratio"] - 1) <= tol))
        if offered:
            out.append(dict(text=f"{name}: at least {offered:,} requests a second offered",
                            value=f"{r['offered_rps']:,.0f}", met=r["offered_rps"] >= offered))
    return out


def run(procs, args):
    ports = [PORT_REDIS, *PORT_NODES]
    busy = [str(p) for p in ports if H.port_busy(p)]
    if busy:
        H.warn(f"limits: ports already in use on 127.0.0.1: {', '.join(busy)}")
        return 1
    tmp = Path(os.environ.get("LARDER_BENCH_TMP") or "/tmp") / "limits"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    binary = H.build_larder(args)
    if isinstance(binary, str):
        H.warn(f"limits: larder not built: {binary}")
        return 1
    redis = procs.spawn("redis", ["redis-server", "--port", str(PORT_REDIS), "--bind",
                                  "127.0.0.1", "--save", "", "--appendonly", "no"],
                        tmp / "redis.log", cpu=H.LOAD_CPU)
    time.sleep(0.5)
    cells = {}
    try:
        cells["one node"] = cell(procs, binary, tmp, 1, False)
        cells["two nodes, fleet"] = cell(procs, binary, tmp, 2, True)
    finally:
        procs.stop(redis)
    doc = dict(scenario="limits", date=dt.date.today().isoformat(), cells=cells)
    doc["goals"] = goals(doc)
    H.write_results(doc, markdown(doc), args)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0
