"""Processes the harness starts and watches: a short command's output, CPU time and busy
shares from /proc, the open-files limit, `Procs` (every child in its own process group, recorded
for bench/run's trap, stopped on exit), process trees and their RSS.
"""

import ctypes
import os
import resource
import signal
import socket
import subprocess
import time

from .common import HOST, NOFILE


def sh(argv, **kw):
    """Run a short command, return stdout+stderr text ('' if missing)."""
    try:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=kw.pop("timeout", 60), **kw)
        return r.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


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
