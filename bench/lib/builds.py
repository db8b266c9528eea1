"""What the harness builds or installs: Python packages into bench/.venv, larder in its
`profiling` profile (release with line tables, for perf and callgrind; and examples/hyper_floor), the systems' versions and the machine's facts for the report.
"""

import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import BROTLI_MODULE, LOAD_CPU, REPO, SUT_CPU, VENV, WRK_THREADS, log
from .processes import sh


def pip_install(pkgs):
    pip = VENV / "bin" / "pip"
    if not pip.exists():
        if subprocess.run([sys.executable, "-m", "venv", str(VENV)]).returncode != 0:
            return False
    log(f"bench: pip install {' '.join(pkgs)} into bench/.venv")
    r = subprocess.run([str(pip), "install", "-q", *pkgs], timeout=900)
    return r.returncode == 0


def build_larder(args):
    """Path of a freshly built binary (profile `profiling`: release with line tables), or a str
    saying why not."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or Path.home() / ".cache" / "larder-target")
    binary = target / "profiling" / "larder"
    if args.no_build:
        if not binary.exists():
            return f"--no-build given and {binary} does not exist"
    else:
        if not shutil.which("cargo"):
            return "cargo not found"
        log(f"bench: cargo build --profile profiling --features asm (CARGO_TARGET_DIR={target})")
        env = dict(os.environ, CARGO_TARGET_DIR=str(target))
        t0 = time.time()
        # with examples/hyper_floor.rs, piper's "hyper" anchor (same dependencies); `asm`:
        # rav1e's and rav1d's assembly, as the shipped builds have it (nasm: bench/run installs
        # it, as tests/provision does)
        r = subprocess.run(["cargo", "build", "--profile", "profiling", "--features", "asm",
                            "--bin", "larder", "--example", "hyper_floor"], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=3600)
        if r.returncode != 0:
            tail = " | ".join(r.stdout.strip().splitlines()[-6:])
            return f"cargo build --profile profiling failed: {tail}"
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
