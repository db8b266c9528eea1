#!/usr/bin/env bash
# bench/callgrind.sh LARDER_BINARY [static|fixed|proxy|pass|nostore|rules|rulesbare|imgwebp|zimg ...]: instructions per request, counted
# by callgrind (user space only), which a noisy shared machine does not blur (docs/design.md
# "The per-request path").
#
# For each cell: larder (one per-core worker) runs under `valgrind --tool=callgrind`, is warmed
# up with 2 s of wrk; a second wrk run opens its connections, the counters are zeroed, and 4 s
# later dumped; the total instructions are divided by the requests served in that window (the
# calls of the route's handler that callgrind counted).
# - static: the 100-byte page bench/data/small.html from a static route (held in memory);
# - fixed:  a fixed response (`respond`, "pong"), pingap-fixed's /ping;
# - proxy:  the same page through a caching proxy route, from an origin that is a second larder
#           (not under valgrind) serving bench/data with `Cache-Control: max-age=3600`: every
#           measured request is a cache hit;
# - pass:   the same route with `cache = false`: every request goes to the origin (the
#           proxy's pass path, without the origin's own cost, which runs outside valgrind);
# - nostore: the caching route of `proxy`, the page answered `Cache-Control: no-store` by the
#           origin: every request a miss that is not stored (pingap-nocache's path).
# - rules:  the cached page of `proxy` behind bench/conf/larder-rules.toml's rules (basic auth
#           from a bcrypt htpasswd file, a rate limit per client address that never refuses,
#           three response header rules), every request with `Authorization: Basic` of user
#           `bench` (bench/run's rules scenario; use PAGE=page.html for its 8 KB page);
# - rulesbare: its twin, the same hit and the same `Authorization` on the `proxy` route
#           without rules (what the rules cost a hit: rules minus rulesbare).
# - imgwebp: a cached image proxy result, bench/run's imgproxy-cached-webp cell: an image route
#           (`root` = bench/data, `cache_results = true`, as bench/conf/larder-images.toml's
#           /cached/ route) asked /insecure/rs:fill:100:100/q:80/plain/local:///photo-640x856.jpg@webp
#           (a 100x100 WebP, about 3 KB): the warm-up's first request makes it, every measured
#           request is a hit (compare with `proxy` at PAGE=page.html, 8 KB, and small.html);
# - zimg:   the same route's zimg API hit, bench/run's zimg-cached cells: photo-640x856.jpg
#           uploaded (POST /upload), then /<md5>?w=100&h=100&g=1&f=jpeg (about 3 KB).
# PAGE=NAME picks another file of bench/data (default small.html; page.html is 8 KB).
# ENCODING=gzip (or br, zstd) sends that Accept-Encoding with every request.
# CONNS=N sets the connection count (default 10); ADMIN=1 adds an admin listener (metrics on).
# CACHESIM=1 adds callgrind's cache simulation (L1 and last-level misses per function, the last
# level sized as this VM's 2 MiB L2: the L3 is shared with other guests; slower).
# LARDER_BINARY: the `profiling` profile's build (release with line tables, so callgrind names
# functions and lines): `cargo build --profile profiling --bin larder`, then
# bench/callgrind.sh target/profiling/larder.
# Needs valgrind and wrk (apt-get install valgrind wrk), and htpasswd (apache2-utils) for rules. 127.0.0.1 only; bounded in time.
set -euo pipefail
bin=$(realpath "${1:?larder binary}"); shift
cells=("$@"); ((${#cells[@]})) || cells=(static proxy)
data="$(cd "$(dirname "$0")" && pwd)/data"
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
port=18400; origin=18401
# CONNS=N: wrk's connection count (default 10; above 512 connections park after every response).
conns=${CONNS:-10}

cat > "$tmp/origin.toml" <<TOML
[[listener]]
addr = "127.0.0.1:$origin"
  [[listener.route]]
  path = "/nostore/"
  static = { root = "$data", cache_control = "no-store", strip_prefix = true }
  [[listener.route]]
  static = { root = "$data", cache_control = "public, max-age=3600" }
TOML

wait_port() { for _ in $(seq 1 300); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

page=${PAGE:-small.html}
for cell in "${cells[@]}"; do
  path="/$page"
  case "$cell" in
    static) route="static = { root = \"$data\" }" ;;
    fixed)  route="respond = { status = 200, body = \"pong\", content_type = \"text/plain\" }"
            path="/ping" ;;
    proxy|pass|nostore|rules|rulesbare)
            route="proxy = { upstream = \"http://127.0.0.1:$origin\" }"
            # pass: nothing stored, every request goes to the origin (the pass path's cost).
            [ "$cell" = pass ] && route="proxy = { upstream = \"http://127.0.0.1:$origin\", cache = false }"
            [ "$cell" = nostore ] && path="/nostore/$page"
            if [ "$cell" = rules ]; then
              # larder-rules.toml's rules, on an htpasswd file as bench/run writes it.
              htpasswd -nbB -C 5 bench bench >"$tmp/bench.htpasswd"
              route="$route
    [[listener.route.rule]]
    basic_auth = { htpasswd = \"$tmp/bench.htpasswd\", realm = \"bench\" }
    [[listener.route.rule]]
    rate_limit = { rate = \"1000000/s\", burst = 1000000, key = \"client\" }
    [[listener.route.rule]]
    response_headers = { set = { \"x-frame-options\" = \"DENY\" } }
    [[listener.route.rule]]
    response_headers = { set = { \"x-content-type-options\" = \"nosniff\" } }
    [[listener.route.rule]]
    response_headers = { set = { \"referrer-policy\" = \"same-origin\" } }"
            fi
            if ! (exec 3<>"/dev/tcp/127.0.0.1/$origin") 2>/dev/null; then
              "$bin" --config "$tmp/origin.toml" >"$tmp/origin.log" 2>&1 &
              wait_port "$origin"
            fi ;;
    imgwebp|zimg)
            mkdir -p "$tmp/images"
            route="images = { dir = \"$tmp/images\", root = \"$data\", workers = 1, cache_results = true }"
            path="/insecure/rs:fill:100:100/q:80/plain/local:///photo-640x856.jpg@webp"
            [ "$cell" = zimg ] && path="/$(md5sum <"$data/photo-640x856.jpg" | cut -d' ' -f1)?w=100&h=100&g=1&f=jpeg" ;;
    *) echo "unknown cell $cell (static, fixed, proxy, pass, nostore, rules, rulesbare, imgwebp, zimg)" >&2; exit 2 ;;
  esac
  admin=""
  # ADMIN=1: an admin listener, so that requests are counted for /metrics.
  [ -n "${ADMIN:-}" ] && admin=$'[admin]\ntoken = "t"\nlisten = "127.0.0.1:18402"'
  cat > "$tmp/$cell.toml" <<TOML
$admin
[server]
workers = 1
threading = "per-core"
[[listener]]
addr = "127.0.0.1:$port"
  [[listener.route]]
  $route
TOML
  sim=(); [ -n "${CACHESIM:-}" ] && sim=(--cache-sim=yes --LL=2097152,16,64)
  valgrind --tool=callgrind "${sim[@]}" --callgrind-out-file="$tmp/$cell.out" "$bin" --config "$tmp/$cell.toml" \
    >"$tmp/$cell.log" 2>&1 &
  vg=$!
  wait_port "$port"
  # zimg: the original uploaded first (its md5 names it in the path).
  [ "$cell" = zimg ] && curl -sf --data-binary "@$data/photo-640x856.jpg" "http://127.0.0.1:$port/upload" >/dev/null
  hdr=(); [ -n "${ENCODING:-}" ] && hdr=(-H "Accept-Encoding: $ENCODING")
  # `bench:bench`, the user of the rules' htpasswd file (sent to the twin too).
  case "$cell" in rules|rulesbare) hdr+=(-H "Authorization: Basic YmVuY2g6YmVuY2g=") ;; esac
  wrk -t1 -c"$conns" -d2s "${hdr[@]}" "http://127.0.0.1:$port$path" >/dev/null
  # The measured window lies inside one wrk run, after its connections are open, so that no
  # connection's accept or close is counted (at 10,000 connections they were a third of the
  # instructions); valgrind is slow, hence wrk's long timeout.
  wrk -t1 -c"$conns" -d60s --timeout 60s "${hdr[@]}" "http://127.0.0.1:$port$path" >/dev/null &
  load=$!
  sleep $((2 + conns / 2000))
  callgrind_control -z "$vg" >/dev/null
  sleep 4
  callgrind_control -d "$vg" >/dev/null
  kill "$load"; wait "$load" 2>/dev/null || true
  sleep 1
  kill "$vg"; wait "$vg" 2>/dev/null || true
  # The dump asked for after the window (part 1) holds it; the file written at exit (part 2)
  # holds only shutdown. Its "summary:" line is the total Ir; the requests served in the
  # window are the calls of the route's handler.
  ir=$(awk '/^summary:/ {print $2}' "$tmp/$cell.out.1")
  reqs=$(python3 - "$tmp/$cell.out.1" <<'PY'
import re, sys
names, cfn, n = {}, None, 0
for line in open(sys.argv[1]):
    if line.startswith("cfn="):
        m = re.match(r"cfn=\((\d+)\)(?: (.*))?", line.strip())
        if m.group(2):
            names[m.group(1)] = m.group(2)
        cfn = names.get(m.group(1))
    elif line.startswith("fn="):
        m = re.match(r"fn=\((\d+)\)(?: (.*))?", line.strip())
        if m and m.group(2):
            names[m.group(1)] = m.group(2)
    elif line.startswith("calls=") and cfn == "larder::route::Handler::serve":
        n += int(line[6:].split()[0])
print(n)
PY
)
  ((reqs > 0)) || { echo "$cell: no calls of larder::route::Handler::serve counted" >&2; exit 1; }
  echo "$cell: $reqs requests, $ir instructions, $((ir / reqs)) instructions/request"
done
