#!/usr/bin/env bash
# bench/threads.sh LARDER_BINARY [ROUNDS]: per-core vs work-stealing threading, A/B interleaved.
# The server is pinned to CPU 0 (taskset -c 0, one worker), wrk to CPU 1; 127.0.0.1 only;
# every run is 5 s. Prints req/s per run for a cache hit... here the 100-byte static file
# (small.html, held in memory) and the 8 KB page, at 100 and 1000 connections.
set -euo pipefail
bin=${1:?larder binary}; rounds=${2:-3}
data=${BENCH_DATA:-$(cd "$(dirname "$0")" && pwd)/data}
tmp=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
port=18300
for mode in per-core work-stealing; do
  cat > "$tmp/$mode.toml" <<TOML
[server]
workers = ${WORKERS:-1}
threading = "$mode"
[[listener]]
addr = "127.0.0.1:$port"
  [[listener.route]]
  static = { root = "$data" }
TOML
done
for r in $(seq "$rounds"); do
  for mode in per-core work-stealing; do
    taskset -c ${SERVER_CPUS:-0} "$bin" -c "$tmp/$mode.toml" >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 50); do curl -sf -o /dev/null "http://127.0.0.1:$port/small.html" && break; sleep 0.1; done
    for path in ${PATHS:-/small.html /page.html}; do
      for c in 100 1000; do
        rps=$(taskset -c 1 timeout 15 wrk -t1 -c$c -d5s "http://127.0.0.1:$port$path" |
              awk '/Requests\/sec/ {print $2}')
        echo "round=$r mode=$mode path=$path conns=$c req/s=$rps"
      done
    done
    kill $pid; wait $pid 2>/dev/null || true
  done
done
