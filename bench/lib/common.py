"""Where things are (the bench folder, data, results), the ports and CPUs every scenario
uses, the suite's time budget, and the log. Imports nothing of the harness.
"""

import sys
from pathlib import Path


BENCH = Path(__file__).resolve().parent.parent
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
    # scenario imgproxy: the anchor of image transforms (a binary named by LARDER_BENCH_IMGPROXY)
    "imgproxy": 18105,
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
    # scenario rules: a hit behind basic auth, a rate limit and header rules, and the same
    # hit on a twin without rules
    "larder-rules": 18102,
    "larder-bare": 18103,
    "nginx-rules": 18104,
    # the seed systems themselves (issue 44), each optional: a binary named by an environment
    # variable (ANCHORS); 18105 is left to the imgproxy anchor (another branch)
    "pingap": 18110,
    "pike": 18111,
    "zimg": 18112,
}
# The seed systems built outside this repository: the environment variable naming each one's
# binary, and where it comes from. Absent, its cells say "skipped: VAR not set".
ANCHORS = {
    "pingap": ("LARDER_BENCH_PINGAP", "crates.io pingap 0.13.1 (cargo install)"),
    "pike": ("LARDER_BENCH_PIKE", "github.com/vicanso/pike, built from its source (Go)"),
    "zimg": ("LARDER_BENCH_ZIMG", "github.com/buaazp/zimg, built from its source (C)"),
}
# Ports that speak HTTPS (the harness's own requests to them skip certificate checks: the
# certificates are made per run for 127.0.0.1, and nothing here leaves loopback).
TLS_PORTS = {PORTS[n] for n in PORTS if "-tls" in n or "-hs-" in n}
SUT_CPU = 0   # systems under test
LOAD_CPU = 1  # wrk (and the origin)
WRK_THREADS = 1
NOFILE = 65536
BROTLI_MODULE = Path("/usr/lib/nginx/modules/ngx_http_brotli_filter_module.so")
SCENARIOS = ["pike", "piper", "pingap", "static-8k", "zimg", "imgproxy", "tls", "pools",
             "rules"]
SUITE_BUDGET_S = 15 * 60
WARMUP_S = 1
# At most this long (s) for a system's background work after a cell's check (a cache
# compressing the variants of a large body it just stored) before the cell is measured.
BACKGROUND_WAIT_S = 180
MIN_RUN_S = 5           # the shortest run the budget may cut a full suite's runs to
RUN_OVERHEAD_S = 1.2    # probes, RSS, origin counter, pauses between runs
PAIR_OVERHEAD_S = 2.0   # warm-up run and checks per cell and system
FIXED_OVERHEAD_S = 40   # starting and stopping servers

def log(msg=""):
    print(msg, flush=True)


def warn(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)
