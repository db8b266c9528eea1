"""The systems under test (`System`) and the run's environment (`Env`): the temp dir, the
origin, and every system started from its configuration when a cell first needs it.
"""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .common import (ANCHORS, BENCH, BROTLI_MODULE, DATA, HOST, LOAD_CPU, PORTS, SUT_CPU,
                     VENV, warn)
from .processes import cmdline, descendants, rss_kb, sh, tree_cpu_ns
from .probes import http_req, raw_response, wait_http
from .builds import build_larder, nginx_version, pip_install, varnish_version


def fill(template: Path, out: Path, subst: dict):
    text = template.read_text()
    for k, v in subst.items():
        text = text.replace(f"@@{k}@@", str(v))
    left = re.findall(r"@@[A-Z_]+@@", text)
    if left:
        raise RuntimeError(f"{template}: unfilled placeholders {sorted(set(left))}")
    out.write_text(text)
    return out


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
        for name, size in (("large-1m.json", 1 << 20), ("large-10m.json", 10 << 20)):
            (self.gen / name).write_bytes(gen_json(size))
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
        head_bytes = data.index(b"\r\n\r\n") + 4
        # A body larder keeps in a memory file and sends with sendfile (src/mapped.rs: 64 KiB
        # and larger, its default cache.zero_copy_min) is replayed the same way.
        zero_copy = source.name == "larder" and len(data) - head_bytes >= ZERO_COPY_MIN
        p = self.procs.spawn("ceiling", [str(exe), str(PORTS["ceiling"]), str(resp)]
                             + (["sendfile"] if zero_copy else []),
                             self.logfile("ceiling"), cpu=SUT_CPU)
        ok, why = wait_http(PORTS["ceiling"], "/", proc=p)
        if not ok:
            self.procs.stop(p)
            return None, f"did not start: {why} {self.tail('ceiling')}"
        s = System("ceiling", PORTS["ceiling"], p, cache_header=source.cache_header,
                   version="bench/ceiling.c")
        s.replays = dict(system=source.name, bytes=len(data), head_bytes=head_bytes,
                         sendfile=zero_copy)
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
                # `larder 0.1.0 (0a1b110 2026-11-28)`: all after the name
                v = sh([str(self.larder_bin), "--version"], timeout=10).split(None, 1)
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

    # -- rules (scenario rules) ---------------------------------------------------
    def _htpasswd(self):
        """The members' file larder-rules and nginx-rules share: user `bench`, password
        `bench`, bcrypt as Apache's `htpasswd -B` writes it (cost 5, the lowest it offers
        bar 4: each nginx request pays one check)."""
        path = self.run / "bench.htpasswd"
        if not path.exists():
            if not shutil.which("htpasswd"):
                raise SkipSystem("htpasswd (apache2-utils) not installed")
            out = sh(["htpasswd", "-nbB", "-C", "5", "bench", "bench"], timeout=30).strip()
            if not out.startswith("bench:$2"):
                raise SkipSystem(f"htpasswd -nbB wrote {out[:40]!r}")
            path.write_text(out + "\n")
        return path

    def _start_larder_rules(self):
        self._htpasswd()
        return self._larder("larder-rules", "larder-rules.toml", "/bench-static/small.html")

    def _start_larder_bare(self):
        return self._larder("larder-bare", "larder.toml", "/ping")

    def _start_nginx_rules(self):
        self._htpasswd()
        return self._nginx("nginx-rules", "nginx-rules.conf")

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

    # the sources larder-img is given (POST /upload) and its URLs name by md5 (@@MD5:file@@;
    # the zimg scenario's @@MD5@@ is the first)
    IMAGE_SOURCES = ("photo-640x856.jpg", "photo-1000x872.jpg")

    def _start_larder_img(self):
        s = self._larder("larder-img", "larder-images.toml", "/")
        s.md5s = {}
        for src in self.IMAGE_SOURCES:
            try:
                st, h, body = http_req(s.port, "/upload", method="POST",
                                       headers={"Content-Type": "image/jpeg"},
                                       body=(DATA / src).read_bytes())
                md5 = json.loads(body)["md5"] if st == 200 else None
            except Exception as e:  # noqa: BLE001 - any failure means "not built yet"
                st, md5, body = f"error {e}", None, b""
            if not md5:
                self.procs.stop(s.proc)
                raise SkipSystem(f"POST /upload of {src} did not return JSON with md5 "
                                 f"(status {st}, {body[:120]!r}): image server not built yet?")
            s.md5s[src] = md5
        s.md5 = s.md5s[self.IMAGE_SOURCES[0]]
        return s

    def _start_imgproxy(self):
        """imgproxy, the anchor of scenario imgproxy: the binary LARDER_BENCH_IMGPROXY names (built
        outside this repository; see docs/benchmarks.md), one worker, no signature, sources read
        from bench/data (local://), its defaults otherwise (no result cache: it has none)."""
        exe = os.environ.get("LARDER_BENCH_IMGPROXY")
        if not exe:
            raise SkipSystem("LARDER_BENCH_IMGPROXY not set (the path of an imgproxy binary)")
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            raise SkipSystem(f"LARDER_BENCH_IMGPROXY={exe} is not an executable file")
        env = dict(os.environ, IMGPROXY_BIND=f"{HOST}:{PORTS['imgproxy']}", IMGPROXY_WORKERS="1",
                   IMGPROXY_LOCAL_FILESYSTEM_ROOT=str(DATA), IMGPROXY_LOG_LEVEL="warn")
        for k in ("IMGPROXY_KEY", "IMGPROXY_SALT"):  # no signature: /insecure/ URLs
            env.pop(k, None)
        p = self.procs.spawn("imgproxy", [exe], self.logfile("imgproxy"), cpu=SUT_CPU, env=env)
        ok, why = wait_http(PORTS["imgproxy"], "/health", timeout=30, proc=p)
        if not ok:
            self.procs.stop(p)
            raise SkipSystem(f"did not start: {why} {self.tail('imgproxy')}")
        ver = sh([exe, "version"], timeout=10).split()
        vips = sh(["pkg-config", "--modversion", "vips"]) or \
            sh(["dpkg-query", "-W", "-f", "${Version}", "libvips42"])
        return System("imgproxy", PORTS["imgproxy"], p,
                      version=f"imgproxy {ver[-1] if ver else '?'} (libvips {vips or '?'})")

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

    # -- the seed systems themselves (issue 44): optional binaries -------------------------
    def _anchor_binary(self, name):
        """The binary of seed system `name` from its environment variable (common.ANCHORS), or
        SkipSystem saying why not: nothing here builds or fetches one."""
        var, origin = ANCHORS[name]
        path = os.environ.get(var)
        if not path:
            raise SkipSystem(f"{var} not set (the {name} binary: {origin}; "
                             "see docs/benchmarks.md)")
        exe = Path(path).expanduser()
        if not (exe.is_file() and os.access(exe, os.X_OK)):
            raise SkipSystem(f"{var}={path} is not an executable file")
        return exe

    def _anchor(self, name, argv, ready_path, cache_header=None, version="", ready_timeout=30):
        """Starts a seed system on CPU 0 and waits until `ready_path` answers 200: a path that
        goes through the system's upstream where it has one, so a proxy that answers 503
        until its first health check (pingap) is waited for, as the harness waits for the
        others."""
        p = self.procs.spawn(name, argv, self.logfile(name), cpu=SUT_CPU, cwd=str(self.run))
        deadline = time.time() + ready_timeout
        st, why = None, ""
        while time.time() < deadline:
            ok, why = wait_http(PORTS[name], ready_path, timeout=max(1, deadline - time.time()),
                                proc=p)
            if not ok:
                break
            try:
                st, _, _ = http_req(PORTS[name], ready_path, timeout=2)
            except OSError as e:
                st, why = None, str(e)
            if st == 200:
                return System(name, PORTS[name], p, cache_header=cache_header, version=version)
            why = f"{ready_path} answered {st}"
            time.sleep(0.2)
        self.procs.stop(p)
        raise SkipSystem(f"did not answer 200 within {ready_timeout}s: {why} {self.tail(name)}")

    def _start_pingap(self):
        """pingap 0.13.1 as its README's performance section runs it (bench/conf/pingap.toml):
        one thread, no access log, its ping plugin, its cache and compression plugins."""
        exe = self._anchor_binary("pingap")
        conf = fill(BENCH / "conf/pingap.toml", self.run / "pingap.toml",
                    dict(self.subst, PORT=PORTS["pingap"]))
        ver = sh([str(exe), "--version"], timeout=10).split("(")[0].strip() or "pingap"
        chk = sh([str(exe), "-t", "-c", str(conf)], timeout=30)
        if "error" in chk.lower():
            raise SkipSystem(f"`pingap -t` rejected bench/conf/pingap.toml: {chk[-300:]}")
        return self._anchor("pingap", [str(exe), "-c", str(conf)], "/nocache/small.html",
                            cache_header="x-cache-status", version=ver)

    def _start_pike(self):
        """pike (v4) in its file-config mode (bench/conf/pike.yml): memory cache storing the
        br and gzip forms beside the response, no admin UI."""
        exe = self._anchor_binary("pike")
        conf = fill(BENCH / "conf/pike.yml", self.run / "pike.yml",
                    dict(self.subst, PORT=PORTS["pike"]))
        return self._anchor("pike", [str(exe), f"--config={conf}"], "/small.html",
                            cache_header="x-status", version=go_binary_version(exe, "pike"))

    def _start_zimg(self):
        """zimg 3 (bench/conf/zimg.lua): one thread, local-disk storage, no memcached, no
        stored results; the photo uploaded as larder-img's is (POST /upload, raw body)."""
        exe = self._anchor_binary("zimg")
        (self.run / "zimg").mkdir(exist_ok=True)
        (self.run / "zimg" / "index.html").write_text("<html><body>zimg</body></html>\n")
        conf = fill(BENCH / "conf/zimg.lua", self.run / "zimg.lua",
                    dict(self.subst, PORT=PORTS["zimg"]))
        s = self._anchor("zimg", [str(exe), str(conf)], "/")
        try:
            st, h, body = http_req(s.port, "/upload", method="POST",
                                   headers={"Content-Type": "jpeg"},
                                   body=(DATA / "photo-640x856.jpg").read_bytes())
            md5 = json.loads(body)["info"]["md5"] if st == 200 else None
        except Exception as e:  # noqa: BLE001 - any failure means the upload did not work
            st, md5, body, h = f"error {e}", None, b"", {}
        if not md5:
            self.procs.stop(s.proc)
            raise SkipSystem(f"POST /upload did not return JSON with info.md5 "
                             f"(status {st}, {body[:120]!r})")
        s.md5 = md5
        s.version = h.get("server", "zimg").split(" ")[0].replace("/", " ")
        return s


def go_binary_version(exe, name):
    """`NAME VERSION` of a Go binary: its main.version (-X main.version=..., as its release
    builds set it) or its module version, read with `go version -m` when go is at hand."""
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists()
                                else None)
    info = sh([go, "version", "-m", str(exe)], timeout=20) if go else ""
    m = (re.search(r"-X[ =]main\.version=([^\s'\"]+)", info)
         or re.search(r"^\s*mod\s+\S+\s+(v[^\s]+)", info, re.M))
    return f"{name} {m.group(1)}" if m else f"{name} (version unknown)"


class SkipSystem(Exception):
    pass


# larder's default cache.zero_copy_min (src/mapped.rs DEFAULT_MIN).
ZERO_COPY_MIN = 64 * 1024


def gen_json(size):
    """Deterministic JSON of exactly `size` bytes (records of words and numbers), compressing
    roughly like an API's large answer; the large bodies of scenario pike."""
    rnd = random.Random(44)
    words = ("cache proxy origin header request response body socket kernel stream "
             "record value name price stock label region active pending").split()
    out, n = [b"["], 1
    i = 0
    while n < size - 200:
        rec = (f'{{"id":{i},"name":"{rnd.choice(words)} {rnd.choice(words)}",'
               f'"value":{rnd.randint(0, 10**9)},"ratio":{rnd.random():.6f},'
               f'"tags":["{rnd.choice(words)}","{rnd.choice(words)}"]}},\n').encode()
        out.append(rec)
        n += len(rec)
        i += 1
    out.append(b'{"end":true}')
    n += 12
    out.append(b" " * (size - n - 2) + b"]\n")
    data = b"".join(out)
    assert len(data) == size
    return data


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
