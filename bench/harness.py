#!/usr/bin/env python3
"""larder benchmark harness; started by bench/run (see docs/benchmarks.md).

Everything it starts listens on 127.0.0.1 only, every load run is wrk with a
fixed duration, and every process it starts is stopped on exit, whatever
happens (try/finally, atexit, SIGINT/SIGTERM/SIGHUP handlers, PR_SET_PDEATHSIG
on each child, and bench/run's own trap over the process groups recorded in
$LARDER_BENCH_PGFILE).
"""

import argparse
import ctypes
import datetime as dt
import gzip
import http.client
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DATA = BENCH / "data"
RESULTS = BENCH / "results"
DOC = REPO / "docs" / "benchmarks.md"
VENV = BENCH / ".venv"
HOST = "127.0.0.1"  # the only address this harness ever talks to

PORTS = {
    "origin": 18081,
    "nginx": 18082,
    "nginx-debian": 18083,
    "varnish": 18084,
    "larder": 18090,
    "larder-img": 18091,
    "ceiling": 18092,
    # examples/hyper_floor.rs: hyper and tokio alone, for piper (what larder's stack costs)
    "hyper": 18101,
    "thumbor": 18888,
    # scenario tls: HTTPS keep-alive (resumption on) and full handshakes (resumption off)
    "larder-tls": 18093,
    "larder-hs-rsa": 18094,
    "larder-hs-ecdsa": 18095,
    "nginx-tls": 18085,
    "nginx-hs-rsa": 18086,
    "nginx-hs-ecdsa": 18087,
    # scenario pools: pools of three backends (two more origin ports, and origin-b, a
    # backend of its own that the failover cell kills)
    "larder-pool": 18096,
    "larder-pool-admin": 18100,
    "nginx-pool": 18089,
    "origin2": 18097,
    "origin3": 18098,
    "origin-b": 18099,
}
# Ports that speak HTTPS (the harness's own requests to them skip certificate checks: the
# certificates are made per run for 127.0.0.1, and nothing here leaves loopback).
TLS_PORTS = {PORTS[n] for n in PORTS if "-tls" in n or "-hs-" in n}
SUT_CPU = 0   # systems under test
LOAD_CPU = 1  # wrk (and the origin)
WRK_THREADS = 1
NOFILE = 65536
BROTLI_MODULE = Path("/usr/lib/nginx/modules/ngx_http_brotli_filter_module.so")
SCENARIOS = ["pike", "piper", "pingap", "static-8k", "zimg", "tls", "pools"]
SUITE_BUDGET_S = 15 * 60
WARMUP_S = 1
MIN_RUN_S = 5           # the shortest run the budget may cut a full suite's runs to
RUN_OVERHEAD_S = 1.2    # probes, RSS, origin counter, pauses between runs
PAIR_OVERHEAD_S = 2.0   # warm-up run and checks per cell and system
FIXED_OVERHEAD_S = 40   # starting and stopping servers

# --------------------------------------------------------------------------
# small helpers


def log(msg=""):
    print(msg, flush=True)


def warn(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def sh(argv, **kw):
    """Run a short command, return stdout+stderr text ('' if missing)."""
    try:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=kw.pop("timeout", 60), **kw)
        return r.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def fill(template: Path, out: Path, subst: dict):
    text = template.read_text()
    for k, v in subst.items():
        text = text.replace(f"@@{k}@@", str(v))
    left = re.findall(r"@@[A-Z_]+@@", text)
    if left:
        raise RuntimeError(f"{template}: unfilled placeholders {sorted(set(left))}")
    out.write_text(text)
    return out


def port_busy(port):
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((HOST, port)) == 0


def cpu_busy_ticks():
    """(busy, total) jiffies over all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    total = sum(v[:8])  # guest time is already inside user
    return total - v[3] - v[4], total


def cpu_ticks(cpu):
    """(busy, total) jiffies of one CPU since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                v = [int(x) for x in line.split()[1:]]
                total = sum(v[:8])
                return total - v[3] - v[4], total
    return 0, 0


def busy_pct(before, after):
    return round(100.0 * (after[0] - before[0]) / max(1, after[1] - before[1]), 1)


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_ns(pid):
    """CPU time (user + system) of process pid in ns: its live threads and those that
    exited (the kernel's per-process CPU clock, CLOCK_PROCESS_CPUTIME_ID of another
    process), plus the children it has reaped, whose time /proc/PID/stat keeps only in
    clock ticks. None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        reaped = (int(fields[13]) + int(fields[14])) * 1_000_000_000 // CLK_TCK
        try:
            own = time.clock_gettime_ns(((~pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, SCHED)
        except OSError:  # exited after the read above (or a zombie): the tick counters
            own = (int(fields[11]) + int(fields[12])) * 1_000_000_000 // CLK_TCK
        return own + reaped
    except (OSError, IndexError, ValueError):
        return None


def tree_cpu_ns(pid):
    """CPU time in ns of pid and all its descendants (see proc_cpu_ns)."""
    return sum(v for v in map(proc_cpu_ns, [pid] + descendants(pid)) if v is not None)


def cpu_busy_pct(interval=1.0):
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    t0, i0 = snap()
    time.sleep(interval)
    t1, i1 = snap()
    return 100.0 * (1 - (i1 - i0) / max(1, t1 - t0))


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(hard, NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --------------------------------------------------------------------------
# processes

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


class Procs:
    """Every process the harness starts, each in its own process group."""

    def __init__(self):
        self.items = []  # (name, Popen)
        self.pgfile = os.environ.get("LARDER_BENCH_PGFILE")

    def spawn(self, name, argv, logpath, cpu=None, nofile=None, env=None, cwd=None):
        if cpu is not None:
            argv = ["taskset", "-c", str(cpu)] + list(argv)

        def pre():
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if nofile:
                _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

        out = open(logpath, "ab") if logpath else subprocess.DEVNULL
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT if logpath else subprocess.DEVNULL,
                             start_new_session=True, preexec_fn=pre, env=env, cwd=cwd)
        if logpath:
            out.close()
        self.items.append((name, p))
        if self.pgfile:
            with open(self.pgfile, "a") as f:
                f.write(f"{p.pid}\n")
        return p

    def stop(self, p, grace=5.0):
        if p.poll() is None or group_alive(p.pid):
            family = descendants(p.pid)
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
                for pid in family:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                deadline = time.time() + grace
                while time.time() < deadline:
                    p.poll()
                    if not group_alive(p.pid) and not any(pid_alive(x) for x in family):
                        break
                    time.sleep(0.05)
                else:
                    continue
                break
        try:
            p.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        self.items = [(n, q) for n, q in self.items if q is not p]

    def stop_all(self):
        for _, p in reversed(list(self.items)):
            self.stop(p)


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def group_alive(pgid):
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    return True
            except (OSError, IndexError, ValueError):
                pass
    return False


def _ppids():
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    out[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def descendants(pid):
    pp = _ppids()
    found, frontier = [], [pid]
    while frontier:
        cur = frontier.pop()
        for child, parent in pp.items():
            if parent == cur and child not in found:
                found.append(child)
                frontier.append(child)
    return found


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def rss_kb(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


# --------------------------------------------------------------------------
# HTTP probes (exact headers: http.client would otherwise add
# "Accept-Encoding: identity", which wrk does not send)


def http_req(port, path, headers=None, method="GET", body=None, timeout=10):
    if port in TLS_PORTS:
        import ssl
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        c = http.client.HTTPSConnection(HOST, port, timeout=timeout, context=ctx)
    else:
        c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        c.putrequest(method, path, skip_accept_encoding=True,
                     skip_host=any(k.lower() == "host" for k in (headers or {})))
        for k, v in (headers or {}).items():
            c.putheader(k, v)
        if body is not None:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


def raw_response(port, path, headers, timeout=10):
    """The exact bytes, head and body, a server sends for the request wrk sends
    (GET, HTTP/1.1, Host with the port, the cell's headers, keep-alive)."""
    req = (f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
           + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n")
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(req.encode("latin-1"))
        buf = b""

        def more():
            nonlocal buf
            d = s.recv(1 << 20)
            if not d:
                raise OSError("connection closed before the response was complete")
            buf += d

        while b"\r\n\r\n" not in buf:
            more()
        head_len = buf.index(b"\r\n\r\n") + 4
        length, chunked = None, False
        for line in buf[:head_len].decode("latin-1").split("\r\n")[1:]:
            k, _, v = line.partition(":")
            k = k.strip().lower()
            if k == "content-length":
                length = int(v.strip())
            elif k == "transfer-encoding" and "chunked" in v.lower():
                chunked = True
        if chunked:  # up to the last chunk (no trailers expected)
            while not (buf.endswith(b"\r\n0\r\n\r\n") or buf[head_len:] == b"0\r\n\r\n"):
                more()
        elif length is None:
            raise ValueError("response has neither Content-Length nor chunked encoding")
        else:
            while len(buf) < head_len + length:
                more()
            if len(buf) != head_len + length:
                raise ValueError(f"{len(buf) - head_len - length} bytes after the response")
        return buf


def wait_http(port, path, timeout=15.0, proc=None):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            return False, f"exited with status {proc.returncode}"
        try:
            st, _, _ = http_req(port, path, timeout=2)
            return True, st
        except OSError as e:
            last = e
        time.sleep(0.1)
    return False, f"no answer on 127.0.0.1:{port}{path} within {timeout:.0f}s ({last})"


def jpeg_info(data):
    """(width, height, components) from a JPEG's SOF marker, or None."""
    i = 2
    if data[:2] != b"\xff\xd8":
        return None
    while i + 9 < len(data):
        if data[i] != 0xFF:
            i += 1
            continue
        m = data[i + 1]
        if m in (0xD8, 0x01) or 0xD0 <= m <= 0xD7 or m == 0xFF:
            i += 1 if m == 0xFF else 2
            continue
        seglen = int.from_bytes(data[i + 2:i + 4], "big")
        if m in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            h = int.from_bytes(data[i + 5:i + 7], "big")
            w = int.from_bytes(data[i + 7:i + 9], "big")
            return w, h, data[i + 9]
        i += 2 + seglen
    return None


def origin_requests():
    """Total requests the origin has served (nginx stub_status)."""
    try:
        _, _, body = http_req(PORTS["origin"], "/__origin_status", timeout=3)
        nums = body.decode().splitlines()[2].split()
        return int(nums[2])
    except Exception:
        return None


# --------------------------------------------------------------------------
# systems under test


class System:
    """A server under test: how to reach it, its cache header, its RSS."""

    def __init__(self, name, port, proc, cache_header=None, rss="tree", version=""):
        self.name, self.port, self.proc = name, port, proc
        self.cache_header = cache_header
        self.rss_mode = rss
        self.version = version

    def pids(self):
        if self.rss_mode == "nginx-worker":
            return [p for p in descendants(self.proc.pid)
                    if "worker process" in cmdline(p)]
        return [self.proc.pid] + descendants(self.proc.pid)

    def rss_kb(self):
        return rss_kb(self.pids())

    def cpu_ns(self):
        return tree_cpu_ns(self.proc.pid)

    def wait_idle(self, limit=20.0):
        """Wait until the server has finished work left by a run's abandoned
        requests (it uses < 10% of a CPU), so the next run starts clean."""
        deadline = time.time() + limit
        last = self.cpu_ns()
        while time.time() < deadline:
            time.sleep(0.2)
            cur = self.cpu_ns()
            if (cur - last) / 1e9 < 0.02:
                return True
            last = cur
        return False


class Env:
    """Per-run temp dir, origin, and lazily started systems."""

    def __init__(self, args, procs):
        self.args, self.procs = args, procs
        # bench/run makes LARDER_BENCH_TMP and removes it whatever happens
        self.run = Path(tempfile.mkdtemp(prefix="larder-bench-",
                                         dir=os.environ.get("LARDER_BENCH_TMP") or None))
        os.chmod(self.run, 0o755)  # varnish's child drops privileges
        self.gen = self.run / "gen"
        self.gen.mkdir()
        for d in ("origin-tmp", "nginx-tmp", "nginx-debian-tmp", "larder-images"):
            (self.run / d).mkdir()
        self.systems = {}
        self.skipped = {}   # system name -> reason
        self.larder_bin = None
        self.larder_version = ""
        self.busy_pct = 0.0
        self.origin_pid = None
        self.subst = {"RUN": self.run, "DATA": DATA, "GEN": self.gen,
                      "ORIGIN_PORT": PORTS["origin"], "ORIGIN_PORT2": PORTS["origin2"],
                      "ORIGIN_PORT3": PORTS["origin3"], "ORIGIN_B_PORT": PORTS["origin-b"]}
        self.origin_b = None

    def cleanup(self):
        shutil.rmtree(self.run, ignore_errors=True)

    def logfile(self, name):
        return self.run / f"{name}.log"

    def tail(self, name, n=8):
        try:
            lines = self.logfile(name).read_text(errors="replace").splitlines()
            return " | ".join(lines[-n:])
        except OSError:
            return ""

    # -- origin -----------------------------------------------------------
    def start_origin(self):
        text = gen_text_24k()
        (self.gen / "text-24k.html").write_text(text)
        conf = fill(BENCH / "conf/origin.nginx.conf", self.run / "origin.conf", self.subst)
        p = self.procs.spawn("origin", ["nginx", "-p", str(self.run), "-c", str(conf),
                                        "-e", str(self.run / "origin-error.log")],
                             self.logfile("origin"), cpu=LOAD_CPU)
        self.origin_pid = p.pid
        ok, why = wait_http(PORTS["origin"], "/small.html", proc=p)
        if not ok:
            raise RuntimeError(f"origin nginx did not start: {why} {self.tail('origin')}")
        st, h, _ = http_req(PORTS["origin"], "/nocache/page.html")
        assert st == 200 and h.get("cache-control") == "no-store", (st, h)

    def start_origin_b(self):
        """(Re)start origin-b, the backend the failover cell kills."""
        if self.origin_b and self.origin_b.poll() is None:
            return
        conf = fill(BENCH / "conf/origin-b.nginx.conf", self.run / "origin-b.conf", self.subst)
        p = self.procs.spawn("origin-b", ["nginx", "-p", str(self.run), "-c", str(conf),
                                          "-e", str(self.run / "origin-b-error.log")],
                             self.logfile("origin-b"), cpu=LOAD_CPU)
        ok, why = wait_http(PORTS["origin-b"], "/nocache/small.html", proc=p)
        if not ok:
            raise RuntimeError(f"origin-b did not start: {why} {self.tail('origin-b')}")
        self.origin_b = p

    def kill_origin_b(self):
        """SIGKILL origin-b's master and workers: its port refuses, its connections reset."""
        p = self.origin_b
        if p is None:
            return
        for pid in [p.pid] + descendants(p.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait(timeout=10)
        self.origin_b = None

    # -- systems ------------------------------------------------------------
    def get(self, name):
        if name in self.systems:
            return self.systems[name]
        if name in self.skipped:
            return None
        try:
            s = getattr(self, "_start_" + name.replace("-", "_"))()
        except SkipSystem as e:
            self.skipped[name] = str(e)
            warn(f"{name}: SKIPPED: {e}")
            return None
        self.systems[name] = s
        return s

    def stop(self, name):
        s = self.systems.pop(name, None)
        if s:
            self.procs.stop(s.proc)

    def _nginx(self, name, template, nofile=None, extra=None):
        subst = dict(self.subst, PORT=PORTS[name], **(extra or {}))
        conf = fill(BENCH / "conf" / template, self.run / f"{name}.conf", subst)
        t = sh(["nginx", "-t", "-p", str(self.run), "-c", str(conf),
                "-e", str(self.run / f"{name}-error.log")])
        if "test is successful" not in t:
            raise SkipSystem(f"nginx -t failed: {t}")
        p = self.procs.spawn(name, ["nginx", "-p", str(self.run), "-c", str(conf),
                                    "-e", str(self.run / f"{name}-error.log")],
                             self.logfile(name), cpu=SUT_CPU, nofile=nofile)
        ok, why = wait_http(PORTS[name], "/bench-static/small.html", proc=p)
        if not ok:
            self.procs.stop(p)
            raise SkipSystem(f"did not start: {why} {self.tail(name)}")
        return System(name, PORTS[name], p, cache_header="x-cache-status",
                      rss="nginx-worker", version=nginx_version())

    def _start_nginx(self):
        load, conf = "# brotli filter module not installed", ""
        if BROTLI_MODULE.exists():
            load = f"load_module {BROTLI_MODULE};"
            conf = ("    brotli on;\n"
                    "    brotli_types text/plain text/css text/xml application/json "
                    "application/javascript application/xml image/svg+xml;")
        return self._nginx("nginx", "nginx.conf", extra={"BROTLI_LOAD": load, "BROTLI_CONF": conf})

    def _start_nginx_debian(self):
        # systemd starts Debian's nginx.service with a soft RLIMIT_NOFILE of 1024
        return self._nginx("nginx-debian", "nginx-debian.conf", nofile=1024)

    def _start_varnish(self):
        if not shutil.which("varnishd"):
            raise SkipSystem("varnishd not installed")
        vcl = fill(BENCH / "conf/varnish.vcl", self.run / "varnish.vcl", self.subst)
        argv = ["varnishd", "-F", "-n", str(self.run / "varnish"),
                "-a", f"{HOST}:{PORTS['varnish']}", "-T", f"{HOST}:0",
                "-f", str(vcl), "-s", "malloc,256m",
                "-p", "http_gzip_support=on",
                "-p", "thread_pools=1", "-p", "thread_pool_min=200",
                "-p", "thread_pool_max=5000"]
        p = self.procs.spawn("varnish", argv, self.logfile("varnish"), cpu=SUT_CPU)
        ok, why = wait_http(PORTS["varnish"], "/small.html", timeout=30, proc=p)
        if not ok:
            self.procs.stop(p)
            raise SkipSystem(f"did not start: {why} {self.tail('varnish')}")
        return System("varnish", PORTS["varnish"], p, cache_header="x-cache",
                      version=varnish_version())

    def _ceiling_exe(self):
        exe = self.run / "ceiling"
        if not exe.exists():
            cc = shutil.which("cc") or shutil.which("gcc")
            if not cc:
                raise SkipSystem("no C compiler (cc) to build bench/ceiling.c")
            out = sh([cc, "-O2", "-o", str(exe), str(BENCH / "ceiling.c")])
            if not exe.exists():
                raise SkipSystem(f"bench/ceiling.c did not compile: {out[-300:]}")
        return exe

    def start_ceiling(self, cell, source, path):
        """(Re)start bench/ceiling.c replaying, byte for byte, the response `source` (a
        System that passed the cell's check) sends for the cell's request: the least a
        server can do to answer it. Returns (System or None, why not)."""
        self.stop("ceiling")
        if "ceiling" in self.skipped:
            return None, self.skipped["ceiling"]
        try:
            exe = self._ceiling_exe()
        except SkipSystem as e:
            self.skipped["ceiling"] = str(e)
            warn(f"ceiling: SKIPPED: {e}")
            return None, str(e)
        try:
            data = raw_response(source.port, path, cell["headers"])
        except (OSError, ValueError) as e:
            return None, f"could not fetch {source.name}'s response to replay: {e}"
        if not data.startswith(b"HTTP/1.1 200 "):
            return None, f"{source.name} answered {data[:40]!r}: nothing to replay"
        resp = self.run / f"ceiling-{cell['id']}.http"
        resp.write_bytes(data)
        p = self.procs.spawn("ceiling", [str(exe), str(PORTS["ceiling"]), str(resp)],
                             self.logfile("ceiling"), cpu=SUT_CPU)
        ok, why = wait_http(PORTS["ceiling"], "/", proc=p)
        if not ok:
            self.procs.stop(p)
            return None, f"did not start: {why} {self.tail('ceiling')}"
        s = System("ceiling", PORTS["ceiling"], p, cache_header=source.cache_header,
                   version="bench/ceiling.c")
        s.replays = dict(system=source.name, bytes=len(data),
                         head_bytes=data.index(b"\r\n\r\n") + 4)
        self.systems["ceiling"] = s
        return s, ""

    def _start_hyper(self):
        """examples/hyper_floor.rs: one thread, hyper's HTTP/1.1 connection per socket and a
        fixed answer with the bytes larder's static route sends for /small.html; no routing,
        cache, parking or watchdog. What a server built on hyper and tokio costs at least."""
        binary = self._larder_binary()
        exe = binary.parent / "examples" / "hyper_floor"
        if not exe.exists():
            raise SkipSystem(f"{exe} missing (built with larder unless --no-build)")
        p = self.procs.spawn("hyper", [str(exe), f"{HOST}:{PORTS['hyper']}"],
                             self.logfile("hyper"), cpu=SUT_CPU)
        ok, why = wait_http(PORTS["hyper"], "/small.html", proc=p)
        if not ok:
            self.procs.stop(p)
            raise SkipSystem(f"did not answer: {why} {self.tail('hyper')}")
        return System("hyper", PORTS["hyper"], p, cache_header=None,
                      version="examples/hyper_floor.rs")

    def _larder_binary(self):
        if self.larder_bin is None:
            self.larder_bin = build_larder(self.args)
            if not isinstance(self.larder_bin, str):
                v = sh([str(self.larder_bin), "--version"], timeout=10).split()
                self.larder_version = v[-1] if v else "unknown"
        if isinstance(self.larder_bin, str):
            raise SkipSystem(self.larder_bin)
        return self.larder_bin

    def _larder(self, name, template, probe_path, extra=None):
        binary = self._larder_binary()
        conf = fill(BENCH / "conf" / template, self.run / f"{name}.toml",
                    dict(self.subst, PORT=PORTS[name], **(extra or {})))
        chk = subprocess.run([str(binary), "check", str(conf)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=30)
        if chk.returncode != 0:
            raise SkipSystem(f"`larder check {conf.name}` failed (exit {chk.returncode}): "
                             f"{chk.stdout.strip()[-400:] or 'no output'}")
        p = self.procs.spawn(name, [str(binary), "--config", str(conf)],
                             self.logfile(name), cpu=SUT_CPU)
        ok, why = wait_http(PORTS[name], probe_path, timeout=15, proc=p)
        if not ok:
            self.procs.stop(p)
            raise SkipSystem(f"binary did not answer: {why} {self.tail(name)}")
        return System(name, PORTS[name], p, cache_header="x-cache",
                      version=self.larder_version)

    def _start_larder(self):
        s = self._larder("larder", "larder.toml", "/ping")
        st, _, body = http_req(s.port, "/ping")
        if st != 200:
            self.procs.stop(s.proc)
            raise SkipSystem(f"/ping answered {st} {body[:80]!r}")
        return s

    # -- pools (scenario pools) ---------------------------------------------------
    def _start_larder_pool(self):
        self.start_origin_b()
        return self._larder("larder-pool", "larder-pool.toml", "/bench-static/small.html",
                            extra={"ADMIN_PORT": PORTS["larder-pool-admin"]})

    def _start_nginx_pool(self):
        self.start_origin_b()
        return self._nginx("nginx-pool", "nginx-pool.conf")

    def failover_probe(self, sysm):
        """For larder, a function telling whether origin-b is out of the failover pool (its
        admin API's status); None for systems that do not say."""
        if sysm.name != "larder-pool":
            return None

        def ejected():
            try:
                st, _, body = http_req(PORTS["larder-pool-admin"], "/_larder/status",
                                       headers={"Authorization": "Bearer bench"}, timeout=2)
                pools = json.loads(body)["pools"]
                fo = next(p for p in pools if p["name"] == "failover")
                return fo["backends"][2]["state"] != "up"
            except Exception:
                return False
        return ejected

    # -- HTTPS (scenario tls) -------------------------------------------------
    def _cert(self, kind):
        """A self-signed certificate for 127.0.0.1 made with openssl: rsa (2048) or ecdsa
        (P-256); the same files serve larder and nginx."""
        cert, key = self.run / f"{kind}.pem", self.run / f"{kind}.key"
        if not cert.exists():
            new = (["-newkey", "rsa:2048"] if kind == "rsa" else
                   ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"])
            out = sh(["openssl", "req", "-x509", *new, "-nodes", "-days", "30",
                      "-subj", "/CN=localhost", "-addext",
                      "subjectAltName=DNS:localhost,IP:127.0.0.1",
                      "-keyout", str(key), "-out", str(cert)])
            if not cert.exists():
                raise SkipSystem(f"openssl could not make a {kind} certificate: {out}")
        return cert, key

    def _larder_tls(self, name, kind, resume):
        cert, key = self._cert(kind)
        s = self._larder(name, "larder-tls.toml", "/ping", extra=dict(
            CERT=cert, KEY=key, SESSION_CACHE=10000 if resume else 0,
            TICKETS="true" if resume else "false"))
        s.version += f" (rustls, {kind})"
        return s

    def _nginx_tls(self, name, kind, resume):
        cert, key = self._cert(kind)
        sessions = ("        ssl_session_cache shared:SSL:10m;\n        ssl_session_tickets on;"
                    if resume else
                    "        ssl_session_cache off;\n        ssl_session_tickets off;")
        s = self._nginx(name, "nginx-tls.conf", extra=dict(
            NAME=name, CERT=cert, KEY=key, SESSIONS=sessions))
        s.version += f" ({sh(['openssl', 'version']).split(' ')[1]}, {kind})"
        return s

    def _start_larder_tls(self):
        return self._larder_tls("larder-tls", "ecdsa", True)

    def _start_larder_hs_rsa(self):
        return self._larder_tls("larder-hs-rsa", "rsa", False)

    def _start_larder_hs_ecdsa(self):
        return self._larder_tls("larder-hs-ecdsa", "ecdsa", False)

    def _start_nginx_tls(self):
        return self._nginx_tls("nginx-tls", "ecdsa", True)

    def _start_nginx_hs_rsa(self):
        return self._nginx_tls("nginx-hs-rsa", "rsa", False)

    def _start_nginx_hs_ecdsa(self):
        return self._nginx_tls("nginx-hs-ecdsa", "ecdsa", False)

    def _start_larder_img(self):
        s = self._larder("larder-img", "larder-images.toml", "/")
        try:
            st, h, body = http_req(s.port, "/upload", method="POST",
                                   headers={"Content-Type": "image/jpeg"},
                                   body=(DATA / "photo-640x856.jpg").read_bytes())
            md5 = json.loads(body)["md5"] if st == 200 else None
        except Exception as e:  # noqa: BLE001 - any failure means "not built yet"
            st, md5, body = f"error {e}", None, b""
        if not md5:
            self.procs.stop(s.proc)
            raise SkipSystem(f"POST /upload did not return JSON with md5 "
                             f"(status {st}, {body[:120]!r}): image server not built yet?")
        s.md5 = md5
        return s

    def _start_thumbor(self):
        exe = VENV / "bin" / "thumbor"
        if not exe.exists():
            ok = pip_install(["thumbor"])
            if not ok or not exe.exists():
                raise SkipSystem("thumbor could not be installed from PyPI into bench/.venv")
        conf = fill(BENCH / "conf/thumbor.conf", self.run / "thumbor.conf", self.subst)
        argv = [str(exe), "-p", str(PORTS["thumbor"]), "-i", HOST, "-c", str(conf),
                "-l", "warning", "--processes", "1"]
        p = self.procs.spawn("thumbor", argv, self.logfile("thumbor"), cpu=SUT_CPU)
        ok, why = wait_http(PORTS["thumbor"], "/healthcheck", timeout=30, proc=p)
        if not ok:
            self.procs.stop(p)
            raise SkipSystem(f"did not start: {why} {self.tail('thumbor')}")
        ver = sh([str(VENV / "bin" / "python"), "-c",
                  "import thumbor; print(thumbor.__version__)"])
        return System("thumbor", PORTS["thumbor"], p, version=f"thumbor {ver}")


class SkipSystem(Exception):
    pass


def gen_text_24k():
    """Deterministic 24 KB HTML-ish text that compresses roughly like a page."""
    rnd = random.Random(5)
    words = ("cache proxy origin header gzip brotli zstd request response vary "
             "encoding latency throughput connection socket buffer stream body "
             "accelerator static image thumbnail worker thread kernel loopback "
             "the a of to and in is for on with as by at from").split()
    out = ["<!doctype html><html><head><title>larder bench 24k</title></head><body>\n"]
    size = len(out[0])
    n = 0
    while size < 24 * 1024 - 200:
        n += 1
        sent = " ".join(rnd.choice(words) for _ in range(rnd.randint(8, 20)))
        line = f'<p id="p{n}" class="c{rnd.randint(0, 9)}">{sent.capitalize()}. {rnd.randint(0, 10**6)}</p>\n'
        out.append(line)
        size += len(line)
    out.append("</body></html>\n")
    text = "".join(out)
    return (text + " " * (24 * 1024 - len(text)))[: 24 * 1024 - 1] + "\n"


# --------------------------------------------------------------------------
# installs and versions


def pip_install(pkgs):
    pip = VENV / "bin" / "pip"
    if not pip.exists():
        if subprocess.run([sys.executable, "-m", "venv", str(VENV)]).returncode != 0:
            return False
    log(f"bench: pip install {' '.join(pkgs)} into bench/.venv")
    r = subprocess.run([str(pip), "install", "-q", *pkgs], timeout=900)
    return r.returncode == 0


def build_larder(args):
    """Path of a freshly built release binary, or a str saying why not."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or Path.home() / ".cache" / "larder-target")
    binary = target / "release" / "larder"
    if args.no_build:
        if not binary.exists():
            return f"--no-build given and {binary} does not exist"
    else:
        if not shutil.which("cargo"):
            return "cargo not found"
        log(f"bench: cargo build --release (CARGO_TARGET_DIR={target})")
        env = dict(os.environ, CARGO_TARGET_DIR=str(target))
        t0 = time.time()
        # with examples/hyper_floor.rs, piper's "hyper" anchor (same dependencies)
        r = subprocess.run(["cargo", "build", "--release", "--bin", "larder",
                            "--example", "hyper_floor"], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=3600)
        if r.returncode != 0:
            tail = " | ".join(r.stdout.strip().splitlines()[-6:])
            return f"cargo build --release failed: {tail}"
        args.build_s = time.time() - t0
        log(f"bench: built in {args.build_s:.0f}s")
        if not binary.exists():
            return f"build succeeded but {binary} is missing"
    return binary


def nginx_version():
    return sh(["nginx", "-v"]).replace("nginx version: ", "")


def varnish_version():
    m = re.search(r"\((varnish-[^ ]+)", sh(["varnishd", "-V"]))
    return m.group(1) if m else ""


def wrk_version():
    m = re.search(r"wrk (\S+)", sh(["wrk", "-v"]))
    return m.group(1) if m else ""


def machine_facts(env):
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    git = sh(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "cpu_busy_pct_at_start": round(env.busy_pct, 1),
        "somaxconn": Path("/proc/sys/net/core/somaxconn").read_text().strip(),
        "nginx": nginx_version(),
        "nginx_brotli_filter": BROTLI_MODULE.exists(),
        "varnish": varnish_version(),
        "wrk": wrk_version(),
        "larder": env.larder_version or "not run",
        "larder_git": git if re.fullmatch(r"[0-9a-f]{4,40}", git or "") else "no commit",
        "python": platform.python_version(),
        "sut_cpu": SUT_CPU,
        "load_cpu": LOAD_CPU,
        "wrk_threads": WRK_THREADS,
    }


# --------------------------------------------------------------------------
# scenarios


AE = {"gzip": {"Accept-Encoding": "gzip"},
      "br": {"Accept-Encoding": "br, gzip"},
      "br-only": {"Accept-Encoding": "br"},
      "zstd": {"Accept-Encoding": "zstd"},
      "identity": {}}


def C(cid, label, conns, systems, paths, kind, headers=None, expect_enc=None, goals=(),
      tool="wrk", kill_at=None):
    """One cell: the same request at the same concurrency on each system.

    kind: hit (must be a cache hit), static, fixed, pass (uncacheable), image
    expect_enc: Content-Encoding the response must carry (None = identity);
                a system that serves something else is recorded as n/a.
    goals: G(...) rows judged on larder's (larder-img's) summary in this cell.
    A "ceiling" among the systems replays the bytes the cell's first system
    (larder) sent for the cell's request (see Env.start_ceiling); its path is
    irrelevant.
    """
    paths = dict(paths)
    if "ceiling" in systems:
        paths.setdefault("ceiling", "/")
    return dict(id=cid, label=label, conns=conns, systems=systems, paths=paths, kind=kind,
                headers=headers or {}, expect_enc=expect_enc, goals=list(goals), tool=tool,
                kill_at=kill_at)


# What a goal row compares: larder's figure, and the figure of the best system in
# `against` (highest req/s, lowest CPU per request or p99).
#   rps      larder req/s >= target x the best of `against`
#   rps_abs  larder req/s >= target (ratio to `against` for information)
#   cpu      larder's server CPU per request <= target x that of `against`
#   p99      larder's p99 <= target x that of `against`
#   errors   larder's socket errors (connect/read/write) == 0
#   lost     larder's failed requests (socket errors, timeouts, non-2xx) == 0
# target None: the ratio is shown for information, nothing is judged.
METRICS = {"rps": ("rps", max, ">="), "rps_abs": ("rps", max, ">="),
           "cpu": ("cpu_us", min, "<="), "p99": ("p99_ms", min, "<="), "errors": (None, None, "=="),
           "lost": (None, None, "==")}


def G(text, metric, against=(), target=None):
    assert metric in METRICS, metric
    return dict(text=text, metric=metric, against=list(against), target=target)


CEILING_HIT = 0.95  # larder's req/s against the ceiling's in every cached-hit cell


def ceiling_goal(what, target=CEILING_HIT):
    return G(f"{what}: larder >= {target:g}x the ceiling" if target else
             f"{what}: larder against the ceiling (no goal)", "rps", ["ceiling"], target)


def scenario_cells(name):
    P = lambda p: {s: p for s in ("larder", "nginx", "varnish")}  # noqa: E731
    if name == "pike":
        cells = []
        for enc, label, exp in (("gzip", "Accept-Encoding: gzip", "gzip"),
                                ("br", "Accept-Encoding: br, gzip", ("br", "gzip")),
                                ("identity", "no Accept-Encoding", None)):
            cells.append(C(f"pike-{enc}", f"/data.json 140 KB hit, {label}", 1000,
                           ["larder", "nginx", "varnish", "ceiling"], P("/data.json"), "hit",
                           AE[enc], exp, goals=[
                               G(f"pike {label}: larder >= 1.5x best anchor", "rps",
                                 ["nginx", "varnish"], 1.5),
                               ceiling_goal(f"pike {label}")]))
        return cells
    if name == "piper":
        cells = []
        path = "/bench-static/small.html"
        for n in (10, 100, 1000, 4000, 10000):
            # "ceiling" is no contender: a minimal server (bench/ceiling.c) replaying larder's
            # response, showing what the kernel and the load generator allow in the cell.
            if n < 1000:
                gs = [G(f"piper {n} conns: larder >= 1.3x tuned nginx", "rps", ["nginx"], 1.3),
                      G(f"piper {n} conns: 0 socket errors", "errors"),
                      G(f"piper {n} conns: CPU per request against tuned nginx (no goal)",
                        "cpu", ["nginx"]),
                      ceiling_goal(f"piper {n} conns", None)]
            else:
                # connection scale, restated so that the load generator cannot cap it (issue 19)
                gs = [G(f"piper {n} conns: larder CPU per request <= 0.77x tuned nginx",
                        "cpu", ["nginx"], 0.77),
                      ceiling_goal(f"piper {n} conns"),
                      G(f"piper {n} conns: 0 socket errors", "errors"),
                      G(f"piper {n} conns: p99 <= tuned nginx", "p99", ["nginx"], 1.0)]
            # "hyper" is no contender either: hyper and tokio alone (examples/hyper_floor.rs)
            gs.append(G(f"piper {n} conns: CPU per request against bare hyper (no goal)",
                        "cpu", ["hyper"]))
            cells.append(C(f"piper-{n}", f"/small.html 100 B static, {n} conns", n,
                           ["larder", "nginx", "nginx-debian", "hyper", "ceiling"],
                           {s: path for s in ("larder", "nginx", "nginx-debian", "hyper")},
                           "static", goals=gs))
        return cells
    if name == "pingap":
        return [
            C("pingap-fixed", "fixed tiny response (/ping, nginx return 200)", 100,
              ["larder", "nginx", "ceiling"], {"larder": "/ping", "nginx": "/ping"}, "fixed",
              goals=[G("pingap fixed response: larder >= 1.0x nginx return 200", "rps",
                       ["nginx"], 1.0),
                     G("pingap fixed response: CPU per request against nginx (no goal)", "cpu",
                       ["nginx"]),
                     ceiling_goal("pingap fixed response", None)]),
            C("pingap-8k-gzip", "/page.html 8 KB hit, Accept-Encoding: gzip", 100,
              ["larder", "nginx", "varnish", "ceiling"], P("/page.html"), "hit", AE["gzip"],
              "gzip", goals=[G("pingap 8 KB hit, gzip: larder >= 1.3x best anchor", "rps",
                               ["nginx", "varnish"], 1.3),
                             ceiling_goal("pingap 8 KB hit, gzip")]),
            C("pingap-8k-identity", "/page.html 8 KB hit, no Accept-Encoding", 100,
              ["larder", "nginx", "varnish", "ceiling"], P("/page.html"), "hit", {}, None,
              goals=[G("pingap 8 KB hit, identity: larder >= 1.3x best anchor", "rps",
                       ["nginx", "varnish"], 1.3),
                     ceiling_goal("pingap 8 KB hit, identity")]),
            C("pingap-nocache", "/nocache/page.html 8 KB uncacheable (proxied every time)", 10,
              ["larder", "nginx"], {s: "/nocache/page.html" for s in ("larder", "nginx")},
              "pass", {}, None,
              goals=[G("pingap uncacheable proxied page: larder >= 1.0x nginx", "rps",
                       ["nginx"], 1.0)]),
        ] + [
            C(f"pingap-otf-{enc}", f"24 KB uncacheable text compressed per request, {enc}", 10,
              ["larder", "nginx"], {s: "/nocache/gen/text-24k.html" for s in ("larder", "nginx")},
              "pass", hdr, enc,
              goals=[G(f"pingap on-the-fly {enc}: larder >= 1.0x nginx", "rps", ["nginx"], 1.0)])
            for enc, hdr in (("gzip", AE["gzip"]), ("br", AE["br-only"]), ("zstd", AE["zstd"]))
        ]
    if name == "static-8k":
        path = "/bench-static/page.html"
        return [
            C(f"static-8k-{enc}", f"/page.html 8 KB static file, {label}", 10,
              ["larder", "nginx", "ceiling"], {"larder": path, "nginx": path}, "static",
              AE[enc], exp,
              goals=[G(f"static 8 KB {enc}: larder vs nginx (no goal)", "rps", ["nginx"]),
                     ceiling_goal(f"static 8 KB {enc}")])
            for enc, label, exp in (("gzip", "Accept-Encoding: gzip", "gzip"),
                                    ("identity", "no Accept-Encoding", None))]
    if name == "zimg":
        return [C(f"zimg-{n}", f"640x856 JPEG -> 100x100 grayscale JPEG, {n} conns", n,
                  ["larder-img", "thumbor"],
                  {"larder-img": "/@@MD5@@?w=100&h=100&g=1&f=jpeg",
                   "thumbor": "/unsafe/100x100/filters:grayscale():format(jpeg)/photo-640x856.jpg"},
                  "image", goals=[G(f"zimg {n} conns: larder >= 1000 req/s uncached", "rps_abs",
                                    ["thumbor"], 1000)])
                for n in (10, 100, 500)] + [
            # The same transform with result caching on: a hit of a stored, prepared
            # response (compare with static-8k). thumbor stores no results by default.
            C(f"zimg-cached-{n}", f"the same, results cached (x-cache: HIT), {n} conns", n,
              ["larder-img", "ceiling"], {"larder-img": "/cached/@@MD5@@?w=100&h=100&g=1&f=jpeg"},
              "image", goals=[ceiling_goal(f"zimg cached {n} conns")])
            for n in (10, 100, 500)]
    if name == "tls":
        page = {s: "/page.html" for s in ("larder-tls", "nginx-tls")}
        ping = {s: "/ping" for s in ("larder-hs-rsa", "larder-hs-ecdsa", "nginx-hs-rsa",
                                     "nginx-hs-ecdsa")}
        return [
            C("tls-8k-keepalive", "/page.html 8 KB hit over HTTPS (TLS 1.3, ECDSA), keep-alive", 100,
              ["larder-tls", "nginx-tls"], page, "hit",
              goals=[G("tls 8 KB hit, keep-alive: larder >= 1.3x nginx", "rps", ["nginx-tls"], 1.3),
                     G("tls 8 KB hit, keep-alive: CPU per request against nginx (no goal)", "cpu",
                       ["nginx-tls"])]),
            C("tls-h2", "/page.html 8 KB hit over HTTP/2 + TLS, h2load -c10 -m10", 10,
              ["larder-tls", "nginx-tls"], page, "hit", tool="h2load",
              goals=[G("tls HTTP/2 8 KB hit: larder >= 1.3x nginx", "rps", ["nginx-tls"], 1.3),
                     G("tls HTTP/2: CPU per request against nginx (no goal)", "cpu",
                       ["nginx-tls"])]),
        ] + [
            C(f"tls-handshake-{kind}", f"/ping over a new TLS connection per request "
              f"({label}, resumption off)", 100,
              [f"larder-hs-{kind}", f"nginx-hs-{kind}"], ping, "fixed",
              {"Connection": "close"},
              goals=[G(f"tls full handshakes {label}: larder >= 1.0x nginx", "rps",
                       [f"nginx-hs-{kind}"], 1.0),
                     G(f"tls full handshakes {label}: CPU per handshake against nginx (no goal)",
                       "cpu", [f"nginx-hs-{kind}"])])
            for kind, label in (("rsa", "RSA-2048"), ("ecdsa", "ECDSA P-256"))]
    if name == "pools":
        page = {s: "/nocache/page.html" for s in ("larder-pool", "nginx-pool")}
        return [
            C("pools-rr3", "/nocache/page.html 8 KB uncacheable, round-robin over 3 backends", 10,
              ["larder-pool", "nginx-pool"], page, "pass",
              goals=[G("pools round-robin of 3, uncached 8 KB: larder >= 1.0x nginx upstream",
                       "rps", ["nginx-pool"], 1.0),
                     G("pools round-robin of 3: CPU per request against nginx (no goal)", "cpu",
                       ["nginx-pool"])]),
            C("pools-failover", "the same through the failover pool, its third backend killed "
              "a third into each run", 10, ["larder-pool", "nginx-pool"], page, "pass",
              {"Host": "fo.test"}, kill_at=1 / 3,
              goals=[G("pools failover: no request lost when a backend dies", "lost"),
                     G("pools failover: req/s against nginx (no goal)", "rps", ["nginx-pool"])]),
        ]
    raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")


# --------------------------------------------------------------------------
# measuring


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
        hit_ok = cell["kind"] != "hit" or (info["cache"] or "").upper() == "HIT"
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
    if cell["kind"] == "image":
        ji = jpeg_info(body)
        info["jpeg"] = ji
        if not ji:
            return dict(info, ok=False, na=False, why="response is not a JPEG")
        if ji[:2] != (100, 100):
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
    timeout_s = 10 if name == "zimg" else 2
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
                    f"{sysm.replays['bytes'] - sysm.replays['head_bytes']:,} B body)")
            else:
                sysm = env.get(sname)
            if sysm is None:
                res[sname] = dict(skipped=env.skipped.get(sname, "not started"))
                continue
            path = cell["paths"][sname].replace("@@MD5@@", getattr(sysm, "md5", ""))
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
        results.append(dict(cell, results=res))
    return results


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


# --------------------------------------------------------------------------
# goals, tables, charts


def _ok_summary(r):
    s = (r or {}).get("summary")
    return s if s and "error" not in s else None


def goals(name, cells):
    """One row per goal of each cell (C(goals=...)), judged on this run's summaries."""
    out = []
    for c in cells:
        res = c["results"]
        lname = next((s for s in res if s == "larder" or s.startswith("larder-")), None)
        lsum = _ok_summary(res.get(lname))
        for g in c.get("goals", []):
            metric, target = g["metric"], g["target"]
            key, best, _ = METRICS[metric]
            row = dict(cell=c["id"], goal=g["text"], metric=metric, target=target,
                       larder=None, baseline=None, baseline_system=None, ratio=None,
                       met=None, note="")
            out.append(row)
            if not lsum:
                lr = res.get(lname) or {}
                row["note"] = "larder " + ("n/a" if lr.get("na") else "not measured")
                continue
            if metric == "errors":
                row["larder"] = lsum["connect"] + lsum["read"] + lsum["write"]
                row["met"] = row["larder"] == 0
                continue
            if metric == "lost":
                lost = lambda x: x["connect"] + x["read"] + x["write"] + x["timeout"] + x["non2xx"]  # noqa: E731
                row["larder"] = lost(lsum)
                row["met"] = row["larder"] == 0
                notes = []
                ej = [e for e in lsum.get("eject_s", []) if e is not None]
                if ej:
                    notes.append("larder ejected the dead backend after "
                                 + ", ".join(f"{e * 1000:.0f} ms" for e in ej))
                for s in res:
                    if s != lname and _ok_summary(res.get(s)):
                        notes.append(f"{s} lost {lost(_ok_summary(res[s]))}")
                row["note"] = "; ".join(notes)
                continue
            if key == "p99_ms" and not lsum["requests"]:
                row["note"] = "larder answered nothing"
                continue
            row["larder"] = lsum.get(key)
            if row["larder"] is None:
                row["note"] = "larder's figure not measured"
                continue
            if metric == "rps_abs":
                row["met"] = row["larder"] >= target
            cands = []
            for b in g["against"]:
                bs = _ok_summary(res.get(b))
                if bs and bs.get(key) is not None and (key != "p99_ms" or bs["requests"]):
                    cands.append((b, bs[key]))
            if not cands:
                if g["against"]:
                    row["note"] = "no baseline measured (" + ", ".join(
                        f"{b}: {res.get(b, {}).get('na') or res.get(b, {}).get('skipped') or 'none'}"
                        for b in g["against"]) + ")"
                continue
            row["baseline_system"], row["baseline"] = best(cands, key=lambda x: x[1])
            if row["baseline"]:
                row["ratio"] = row["larder"] / row["baseline"]
            if row["ratio"] is not None and target is not None and metric != "rps_abs":
                row["met"] = (row["ratio"] >= target if best is max else row["ratio"] <= target)
            if metric == "rps":  # how far wrk's own core set the pace
                row["note"] = "wrk CPU " + ", ".join(
                    f"{s} {_ok_summary(res.get(s)).get('wrk_cpu_pct', '-')}%"
                    for s in (lname, row["baseline_system"]))
    return out


def human_bytes(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def fmt_us(us):
    return "-" if us is None else f"{us:.1f}" if us < 100 else f"{us:,.0f}"


def fmt_mib(kb):
    return f"{kb / 1024:.1f}" if kb else "-"


def fmt_goal(metric, v):
    if v is None:
        return "-"
    return {"rps": f"{v:,.0f} req/s", "rps_abs": f"{v:,.0f} req/s", "cpu": f"{v:.1f} µs/req",
            "p99": f"{v:.2f} ms p99", "errors": f"{v} socket errors",
            "lost": f"{v} lost"}[metric]


def goals_table(rows, scenario):
    """Markdown lines: one row per goal (goals()), met or not with the figures."""
    L = ["| cell | goal | larder | against | ratio | target | met |",
         "|---|---|--:|--:|--:|--:|---|"]
    for g in rows:
        # rows of results written before issue 19 have no metric: req/s goals
        metric = g.get("metric") or ("rps_abs" if scenario == "zimg" else "rps")
        base = (f"{g['baseline_system']} {fmt_goal(metric, g['baseline'])}"
                if g["baseline"] is not None else "-")
        ratio = f"{g['ratio']:.2f}x" if g["ratio"] is not None else "-"
        t = g["target"]
        tgt = ("0" if metric == "errors" else "-" if t is None else
               f">= {t:g} req/s" if metric == "rps_abs" else
               f"{METRICS[metric][2]} {t:g}x")
        met = {True: "yes", False: "**no**", None: "-"}[g["met"]]
        note = f" ({g['note']})" if g["note"] else ""
        L.append(f"| {g.get('cell', '')} | {g['goal']} | {fmt_goal(metric, g['larder'])} | "
                 f"{base} | {ratio} | {tgt} | {met}{note} |")
    return L


def markdown(doc):
    L = []
    L.append(f"### {doc['scenario']} ({doc['date']}, {doc['duration_s']} s x {doc['reps']} runs per cell)")
    L.append("")
    L.append("| cell | conns | system | req/s | server CPU µs/req | transfer/s | p50 ms | p99 ms | socket err c/r/w | timeouts | non-2xx | RSS peak/after MiB | served | origin reqs | other CPU % | own CPU % server/wrk |")
    L.append("|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|")
    for c in doc["cells"]:
        for sname, r in c["results"].items():
            head = f"| {c['id']} | {c['conns']} | {sname} |"
            if "summary" in r and "error" not in r["summary"]:
                s = r["summary"]
                chk = r.get("check", {})
                served = chk.get("encoding") or "identity"
                if chk.get("cache"):
                    served += f", {chk['cache']}"
                    after = r.get("check_after", {}).get("cache")
                    if after and after != chk["cache"]:
                        served += f"->{after}"
                if chk.get("jpeg"):
                    served = "{}x{} {}ch".format(*chk["jpeg"])
                if chk.get("hit") is False:
                    served += " (NOT A HIT)"
                if r.get("replays"):
                    served += f", {r['replays']['system']}'s bytes"
                lat = (f"{s['p50_ms']:.2f} | {s['p99_ms']:.2f}" if s["requests"] else "- | -")
                L.append(f"{head} {s['rps']:,.0f} | {fmt_us(s.get('cpu_us'))} | "
                         f"{human_bytes(s['bytes_per_s'])}/s | {lat} | "
                         f"{s['connect']}/{s['read']}/{s['write']} | {s['timeout']} | {s['non2xx']} | "
                         f"{fmt_mib(s['rss_peak_kb'])}/{fmt_mib(s['rss_after_kb'])} | {served} | "
                         f"{'-' if s['origin_requests'] is None else s['origin_requests']} | "
                         f"{s.get('other_cpu_pct', 0):.0f} | "
                         f"{s.get('server_cpu_pct', '-')}/{s.get('wrk_cpu_pct', '-')} |")
            else:
                if r.get("na"):
                    what, why = "n/a", r["na"]
                elif r.get("skipped") and r["skipped"] == doc.get("skipped_systems", {}).get(sname):
                    what, why = "skipped", "see below"
                else:
                    what = "skipped"
                    why = r.get("skipped") or r.get("summary", {}).get("error") or "not run"
                why = why.replace("|", "/")[:160]
                L.append(f"{head} {what} | - | - | - | - | - | - | - | - | {why} | - | - | - |")
    L.append("")
    if doc["goals"]:
        L += goals_table(doc["goals"], doc["scenario"])
        L.append("")
    if doc.get("skipped_systems"):
        for s, why in doc["skipped_systems"].items():
            L.append(f"- {s} skipped: {why}")
        L.append("")
    return "\n".join(L)


COLORS = {"larder": "#d62728", "larder-img": "#d62728", "nginx": "#2ca02c",
          "nginx-debian": "#98df8a", "varnish": "#1f77b4", "thumbor": "#9467bd",
          "ceiling": "#7f7f7f", "hyper": "#ff7f0e",
          "larder-tls": "#d62728", "larder-hs-rsa": "#d62728", "larder-hs-ecdsa": "#d62728",
          "nginx-tls": "#2ca02c", "nginx-hs-rsa": "#2ca02c", "nginx-hs-ecdsa": "#2ca02c"}


def chart(doc, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warn("matplotlib missing: no chart (bench/run installs it into bench/.venv)")
        return False
    cells = doc["cells"]

    def val(c, s, k):
        r = c["results"].get(s, {}).get("summary")
        if not r or "error" in r or (k != "rps" and not r.get("requests")):
            return None  # no latency without a single response
        return r.get(k)  # results from before issue 19 have no CPU figures

    systems, missing = [], []
    for c in cells:
        for s in c["systems"]:
            if s in systems or s in missing:
                continue
            (systems if any(val(x, s, "rps") is not None for x in cells) else missing).append(s)

    panels = (("rps", "req/s"), ("p99_ms", "p99 latency (ms)"),
              ("cpu_us", "server CPU per request (µs)"), ("wrk_cpu_pct", "wrk's own CPU (%)"))
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    axes = axes.flatten()
    if doc["scenario"] == "piper":
        xs = [c["conns"] for c in cells]
        for s in systems:
            for ax, (k, _) in zip(axes, panels):
                pts = [(x, val(c, s, k)) for x, c in zip(xs, cells) if val(c, s, k) is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s,
                            color=COLORS.get(s))
        for ax, (_, title) in zip(axes, panels):
            ax.set_xscale("log")
            ax.set_xlabel("connections")
            ax.set_title(title)
            ax.set_xticks(xs)
            ax.set_xticklabels([str(x) for x in xs])
            ax.grid(alpha=0.3)
        axes[1].set_yscale("log")
        axes[2].set_yscale("log")  # a server failing its connections spends 100x per answer
    else:
        labels = [c["id"].replace(doc["scenario"] + "-", "") for c in cells]
        w = 0.8 / max(1, len(systems))
        for i, s in enumerate(systems):
            for ax, (k, _) in zip(axes, panels):
                xs, ys = [], []
                for j, c in enumerate(cells):
                    v = val(c, s, k)
                    if v is not None:
                        xs.append(j + (i - (len(systems) - 1) / 2) * w)
                        ys.append(v)
                ax.bar(xs, ys, width=w, label=s, color=COLORS.get(s))
            for j, c in enumerate(cells):  # mark n/a and skipped bars
                r = c["results"].get(s, {})
                if s in c["systems"] and val(c, s, "rps") is None:
                    axes[0].text(j + (i - (len(systems) - 1) / 2) * w, 0,
                                 "n/a" if r.get("na") else "x", ha="center", va="bottom",
                                 fontsize=7, rotation=90, color=COLORS.get(s))
        for ax, (_, title) in zip(axes, panels):
            ax.set_xticks(range(len(cells)))
            ax.set_xticklabels(labels, rotation=20, ha="right")
            ax.set_title(title)
            ax.grid(axis="y", alpha=0.3)
        for ax, k in ((axes[1], "p99_ms"), (axes[2], "cpu_us")):
            if any(val(c, s, k) for c in cells for s in systems):
                ax.set_yscale("log")
    if systems:
        axes[0].legend()
    note = f"; not measured: {', '.join(missing)}" if missing else ""
    fig.suptitle(f"{doc['scenario']} - {doc['date']} - {doc['machine']['cpu']}, "
                 f"server on 1 core, wrk on the other{note}")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return True


DOC_START = "<!-- bench:results:start -->"
DOC_END = "<!-- bench:results:end -->"


def update_docs():
    """Put the newest result of every scenario between the markers in docs/benchmarks.md."""
    if not DOC.exists():
        warn(f"{DOC} missing; not updated")
        return
    parts = []
    machine = None
    stands, runs = goals_table([], "")[:2], []
    for name in SCENARIOS:
        found = sorted(RESULTS.glob(f"*-{name}.json"))
        found = [f for f in found if re.fullmatch(rf"\d{{4}}-\d\d-\d\d-{re.escape(name)}\.json", f.name)]
        if not found:
            parts.append(f"### {name}\n\nnot run yet.\n")
            continue
        j = json.loads(found[-1].read_text())
        machine = machine or j["machine"]
        stands += goals_table(j.get("goals", []), name)[2:]
        runs.append(f"{name} {j['date']}")
        md = found[-1].with_suffix(".md").read_text()
        png = found[-1].with_suffix(".png")
        parts.append(md)
        if png.exists():
            parts.append(f"![{name}](../bench/results/{png.name})\n")
    if machine:
        m = machine
        facts = (f"Machine: {m['nproc']} cores ({m['cpu']}), kernel {m['kernel']}, "
                 f"{m['mem_gib']} GiB; nginx {m['nginx']} (brotli filter: "
                 f"{'yes' if m['nginx_brotli_filter'] else 'no'}), {m['varnish']}, wrk {m['wrk']}, "
                 f"larder {m['larder']} (git {m['larder_git']}). Servers pinned to CPU "
                 f"{m['sut_cpu']}, wrk ({m['wrk_threads']} thread) and the origin to CPU {m['load_cpu']}.\n")
        parts.insert(0, facts)
        parts.insert(1, "### Where larder stands\n\nEvery goal of every cell, each from one run "
                        f"(the newest of each scenario: {', '.join(runs)}; details below).\n\n"
                        + "\n".join(stands) + "\n")
    text = DOC.read_text()
    if DOC_START not in text or DOC_END not in text:
        warn(f"{DOC} has no results markers; not updated")
        return
    head, rest = text.split(DOC_START, 1)
    _, tail = rest.split(DOC_END, 1)
    DOC.write_text(head + DOC_START + "\n" + "\n".join(parts) + "\n" + DOC_END + tail)
    log(f"bench: updated {DOC.relative_to(REPO)}")


# --------------------------------------------------------------------------
# main


def only_systems(systems, args):
    """The systems --systems keeps (a name, or its first part: larder keeps larder-img)."""
    if not args.systems:
        return list(systems)
    keep = set(args.systems.split(","))
    return [s for s in systems if s in keep or s.split("-")[0] in keep]


def plan_seconds(names, duration, reps, args):
    """(estimated seconds, number of cell/system pairs that will run)."""
    n = 0
    for name in names:
        for c in scenario_cells(name):
            systems = only_systems(c["systems"], args)
            # cells a system is known to be unable to serve are not run
            if c["id"] == "pingap-otf-zstd":
                systems = [s for s in systems if s != "nginx"]
            if c["id"] == "pingap-otf-br" and not BROTLI_MODULE.exists():
                systems = [s for s in systems if s != "nginx"]
            n += len(systems)
    est = FIXED_OVERHEAD_S + n * PAIR_OVERHEAD_S + n * reps * (duration + RUN_OVERHEAD_S)
    return est, n


def write_results(doc, md, args):
    """Prints a scenario's markdown and, unless --no-write, writes bench/results/DATE-NAME.{json,md}
    (the scenarios that run on their own: push, tiers)."""
    log("\n" + md)
    if args.no_write:
        return
    RESULTS.mkdir(exist_ok=True)
    base = RESULTS / f"{doc['date']}-{doc['scenario']}"
    base.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    base.with_suffix(".md").write_text(md + "\n")
    log(f"bench: wrote {base.relative_to(REPO)}.{{json,md}}")


def main():
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__.split("\n")[0])
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                    help=f"any of {', '.join(SCENARIOS)} (default: all), or push "
                         "(SSE fan-out against nginx + nchan, bench/push_bench.py), or tiers "
                         "(disk and shared cache tiers, bench/tiers_bench.py)")
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
    names = [n for n in names if n not in ("push", "tiers")]
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
