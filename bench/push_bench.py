"""Scenario push (bench/run push): live JSON records pushed to SSE subscribers, larder against
nginx with Debian's libnginx-mod-nchan, side by side in one run, with a ceiling beside them
(bench/push_ceiling.c: one send() per subscriber per sweep and nothing else).

Each server runs alone on CPU 0 (larder with one worker; nginx with one worker process). On
CPU 1, bench/sse_client.c holds every subscriber on one thread (epoll) and a publisher sends
small JSON changes (~90 bytes) at a fixed rate: larder gets `PUT /records/bench/1`, nchan
`POST /pub`. Each change carries the publisher's wall clock in microseconds; the client
measures publish-to-delivery latency on every delivery and counts them per connection.

Per cell (subscribers x publish rate) and server: delivered messages per second, p50/p99
latency, lost deliveries (expected minus delivered), the server's CPU time per delivery
(all its threads), the client's CPU time per delivery (to show whether it was the
bottleneck), and RSS per idle subscriber (RSS with every subscriber connected minus RSS
before, over the count).
"""

import datetime as dt
import http.client
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import lib as H

PORT_LARDER = 18102
PORT_NCHAN = 18101
PORT_CEILING = 18103
PAD = "x" * 40  # a change is ~90 bytes of JSON

CELLS = [
    # (subscribers, publishes per second, publishes)
    (1000, 100, 600),
    (1000, 200, 1200),
    (10000, 10, 60),
    (10000, 20, 120),
    (10000, 25, 150),
    (10000, 30, 180),
]

IDLE_SUBS = 10000
GOAL_RATE = 200_000  # deliveries/s at 10,000 subscribers
GOAL_P99_MS = 100.0

NCHAN_CONF = """load_module /usr/lib/nginx/modules/ngx_nchan_module.so;
worker_processes 1;
pid {tmp}/nchan.pid;
error_log {tmp}/nchan-error.log warn;
events {{ worker_connections 30000; use epoll; multi_accept on; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/nchan-body;
  proxy_temp_path {tmp}/nchan-proxy;
  fastcgi_temp_path {tmp}/nchan-fcgi;
  uwsgi_temp_path {tmp}/nchan-uwsgi;
  scgi_temp_path {tmp}/nchan-scgi;
  server {{
    listen 127.0.0.1:{port} backlog=65535;
    location = /sub {{
      nchan_subscriber eventsource;
      nchan_channel_id bench;
      nchan_subscriber_first_message newest;
    }}
    location = /pub {{
      nchan_publisher;
      nchan_channel_id bench;
      nchan_message_buffer_length 16;
      nchan_message_timeout 60s;
    }}
  }}
}}
"""

LARDER_CONF = """[server]
workers = 1
[[listener]]
addr = "127.0.0.1:{port}"
  [[listener.route]]
  path = "/records/"
  push = {{ dir = "{tmp}/records", token = "bench" }}
"""


class System:
    def __init__(self, name, port, sub_path, proc):
        self.name, self.port, self.sub_path, self.proc = name, port, sub_path, proc

    def publish(self, conn, body):
        # The ceiling takes any PUT as a publish, larder's path included.
        if self.name == "nchan":
            conn.request("POST", "/pub", body, {"Content-Type": "application/json"})
        else:
            conn.request("PUT", "/records/bench/1", body, {"Authorization": "Bearer bench"})
        r = conn.getresponse()
        r.read()
        return r.status < 300

    def pids(self):
        return [self.proc.pid] + H.descendants(self.proc.pid)


def start_systems(procs, args, tmp):
    systems, skipped = [], {}
    binary = H.build_larder(args)
    if isinstance(binary, str):
        skipped["larder"] = binary
    else:
        conf = tmp / "larder-push.toml"
        conf.write_text(LARDER_CONF.format(port=PORT_LARDER, tmp=tmp))
        p = procs.spawn("larder", [str(binary), "--config", str(conf)], tmp / "larder.log",
                        cpu=0)
        systems.append(System("larder", PORT_LARDER, "/records/bench/1?subscribe&init=0", p))
    if not Path("/usr/lib/nginx/modules/ngx_nchan_module.so").exists():
        skipped["nchan"] = "libnginx-mod-nchan is not installed"
    else:
        conf = tmp / "nchan.conf"
        conf.write_text(NCHAN_CONF.format(port=PORT_NCHAN, tmp=tmp))
        p = procs.spawn("nchan", ["nginx", "-c", str(conf), "-g", "daemon off;"],
                        tmp / "nchan.log", cpu=0)
        systems.append(System("nchan", PORT_NCHAN, "/sub", p))
    # The ceiling (bench/push_ceiling.c): what a server doing nothing but one send() per
    # subscriber per sweep reaches on this machine, beside the two.
    ceiling = build_c(tmp, "push_ceiling")
    p = procs.spawn("ceiling", [str(ceiling), str(PORT_CEILING)], tmp / "ceiling.log", cpu=0)
    systems.append(System("ceiling", PORT_CEILING, "/records/bench/1", p))
    for s in systems:
        deadline = time.time() + 15
        while time.time() < deadline:
            try:
                if s.name == "ceiling":  # its GET never ends: a connection is enough
                    socket.create_connection((H.HOST, s.port), timeout=2).close()
                    break
                c = http.client.HTTPConnection(H.HOST, s.port, timeout=2)
                c.request("GET", "/")
                c.getresponse().read()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit(f"{s.name} did not start on port {s.port}")
    return systems, skipped


def build_c(tmp, name):
    out = tmp / name
    src = H.BENCH / f"{name}.c"
    r = subprocess.run(["gcc", "-O2", "-o", str(out), str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"cannot build {src}: {r.stderr}")
    return out


def build_client(tmp):
    return build_c(tmp, "sse_client")


def idle_rss(system, client, subs):
    """RSS per idle subscriber on a fresh server: RSS with `subs` subscribers connected and
    idle for 2 s, minus RSS before, over `subs` (KiB)."""
    rss0 = H.rss_kb(system.pids())
    cl = subprocess.Popen(["taskset", "-c", "1", str(client), str(system.port), system.sub_path,
                           str(subs), "1", "120"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if cl.stdout.readline().strip() != "ready":
            return None
        time.sleep(2.0)
        return (H.rss_kb(system.pids()) - rss0) / subs
    finally:
        cl.kill()
        cl.wait()
        time.sleep(2.0)


def run_cell(system, client, subs, rate, count):
    expected = subs * count
    timeout = int(count / rate) + 60
    rss0 = H.rss_kb(system.pids())
    cl = subprocess.Popen(["taskset", "-c", "1", str(client), str(system.port), system.sub_path,
                           str(subs), str(expected), str(timeout)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = cl.stdout.readline().strip()
    if line != "ready":
        err = cl.stderr.read()
        cl.kill()
        return dict(error=f"subscribers did not connect: {line} {err.strip()[:300]}")
    time.sleep(1.0)  # let the server settle with every subscriber idle
    rss1 = H.rss_kb(system.pids())
    cpu0 = sum(H.proc_cpu_ns(p) for p in system.pids())
    # Each core's busy share while publishing: the server's (CPU 0) and the load side's (CPU 1:
    # the client, the publisher and the loopback receive path), to say which one set the pace.
    core0, core1 = H.cpu_ticks(0), H.cpu_ticks(1)
    conn = http.client.HTTPConnection(H.HOST, system.port, timeout=10)
    failed = 0
    t0 = time.time()
    for k in range(count):
        due = t0 + k / rate
        d = due - time.time()
        if d > 0:
            time.sleep(d)
        body = json.dumps({"t": int(time.time() * 1e6), "n": k, "pad": PAD},
                          separators=(",", ":"))
        if not system.publish(conn, body):
            failed += 1
    pub_s = time.time() - t0
    busy0 = H.busy_pct(core0, H.cpu_ticks(0))
    busy1 = H.busy_pct(core1, H.cpu_ticks(1))
    out, err = cl.communicate(timeout=timeout + 30)
    cpu1 = sum(H.proc_cpu_ns(p) for p in system.pids())
    try:
        r = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return dict(error=f"client said: {out.strip()[-300:]} {err.strip()[-300:]}")
    d = max(r["delivered"], 1)
    span = max(r["span_s"], pub_s)
    r.update(
        subs=subs, rate=rate, publishes=count, publish_failures=failed,
        delivered_per_s=r["delivered"] / span,
        lost=expected - r["delivered"],
        server_cpu_us=(cpu1 - cpu0) / 1000 / d,
        client_cpu_us=r["client_cpu_s"] * 1e6 / d,
        rss_per_sub_kb=(rss1 - rss0) / subs,
        rss_kb=rss1,
        cpu0_busy_pct=busy0,
        cpu1_busy_pct=busy1,
    )
    time.sleep(2.0)  # the server drops the closed subscribers
    return r


def markdown(doc):
    lines = [f"### push: SSE fan-out, larder vs nginx + nchan ({doc['date']})", "",
             "Command: `bench/run push`. Server on CPU 0 (one worker), subscribers "
             "(bench/sse_client.c, one epoll thread) and publisher on CPU 1; ~90-byte JSON "
             "changes; latency is publish to delivery, measured on every delivery. `ceiling` "
             "is bench/push_ceiling.c: one send() per subscriber per sweep and nothing else.",
             "",
             "| subscribers | publishes/s | system | delivered/s | p50 ms | p99 ms | lost | "
             "server µs/delivery | client µs/delivery | RSS/subscriber KiB | CPU0/CPU1 % |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    # RSS/subscriber in the table is the growth during the cell (it includes event buffers).
    for cell in doc["cells"]:
        for name, r in cell["results"].items():
            if "error" in r:
                lines.append(f"| {cell['subs']:,} | {cell['rate']} | {name} | error: "
                             f"{r['error']} | | | | | | | |")
                continue
            lines.append(
                f"| {cell['subs']:,} | {cell['rate']} | {name} | {r['delivered_per_s']:,.0f} | "
                f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['lost']:,} | "
                f"{r['server_cpu_us']:.2f} | {r['client_cpu_us']:.2f} | "
                f"{r['rss_per_sub_kb']:.1f} | "
                f"{r.get('cpu0_busy_pct', 0):.0f}/{r.get('cpu1_busy_pct', 0):.0f} |")
    lines.append("")
    for g in doc["goals"]:
        mark = {True: "met", False: "NOT met", None: "n/a"}[g["met"]]
        lines.append(f"- goal: {g['text']}: {g['value']} ({mark})")
    return "\n".join(lines)


def goals(cells, idle):
    out = []
    best = None
    for cell in cells:
        r = cell["results"].get("larder", {})
        if cell["subs"] == 10000 and "error" not in r and r:
            ok = r["lost"] == 0 and r["p99_ms"] <= GOAL_P99_MS
            if ok and (best is None or r["delivered_per_s"] > best["delivered_per_s"]):
                best = r
    out.append(dict(text=f"at 10,000 subscribers, >= {GOAL_RATE:,} delivered/s with p99 <= "
                         f"{GOAL_P99_MS:.0f} ms and 0 lost",
                    value=f"{best['delivered_per_s']:,.0f}/s (p99 {best['p99_ms']:.1f} ms)"
                    if best else "no cell met p99 and 0 lost",
                    met=bool(best and best["delivered_per_s"] >= GOAL_RATE)))
    a, b = idle.get("larder"), idle.get("nchan")
    if a is not None and b is not None:
        out.append(dict(text=f"RSS per idle subscriber ({IDLE_SUBS:,} on a fresh server) under "
                             "half of nchan's",
                        value=f"{a:.2f} KiB vs {b:.2f} KiB", met=a < b / 2))
    return out


def run(procs, args):
    # A stray server on one of these ports would be measured in place of the one started here.
    busy = [str(p) for p in (PORT_LARDER, PORT_NCHAN, PORT_CEILING) if H.port_busy(p)]
    if busy:
        H.warn(f"push: ports already in use on 127.0.0.1: {', '.join(busy)}")
        return 1
    tmp = Path(os.environ.get("LARDER_BENCH_TMP") or "/tmp") / "push"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    client = build_client(tmp)
    systems, skipped = start_systems(procs, args, tmp)
    for n, why in skipped.items():
        H.warn(f"push: {n} skipped: {why}")
    cells = []
    idle = {}
    try:
        for s in systems:
            if s.name == "ceiling":  # it keeps nothing per subscriber
                continue
            idle[s.name] = idle_rss(s, client, IDLE_SUBS)
            H.log(f"    {s.name:8s} RSS per idle subscriber ({IDLE_SUBS:,} on a fresh server): "
                  + (f"{idle[s.name]:.2f} KiB" if idle[s.name] is not None else "n/a"))
        for subs, rate, count in CELLS:
            H.log(f"--- push: {subs} subscribers, {rate} publishes/s")
            res = {}
            for s in systems:  # interleaved: each cell runs on every system in turn
                r = run_cell(s, client, subs, rate, count)
                res[s.name] = r
                if "error" in r:
                    H.log(f"    {s.name:8s} ERROR {r['error']}")
                else:
                    H.log(f"    {s.name:8s} {r['delivered_per_s']:>10,.0f} delivered/s  "
                          f"p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  "
                          f"lost {r['lost']}  server {r['server_cpu_us']:.2f} µs/delivery  "
                          f"client {r['client_cpu_us']:.2f} µs/delivery  "
                          f"RSS/sub {r['rss_per_sub_kb']:.1f} KiB  "
                          f"CPU0/CPU1 {r['cpu0_busy_pct']:.0f}/{r['cpu1_busy_pct']:.0f}%")
            cells.append(dict(subs=subs, rate=rate, publishes=count, results=res))
    finally:
        for s in systems:
            procs.stop(s.proc)
    doc = dict(scenario="push", date=dt.date.today().isoformat(), cells=cells,
               skipped=skipped, idle_rss_per_sub_kb=idle)
    doc["goals"] = goals(cells, idle)
    H.write_results(doc, markdown(doc), args)
    return 0
