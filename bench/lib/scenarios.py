"""The scenarios' cells (what is requested, how, from which systems), their goals and how
goals are judged, and the time plan of a run (`plan_seconds`, `only_systems`).
"""

import os

from .common import (ANCHORS, BROTLI_MODULE, FIXED_OVERHEAD_S, PAIR_OVERHEAD_S, RUN_OVERHEAD_S,
                     SCENARIOS)
from .quality import judge


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
#   quality  larder's output's SSIM >= that of `against` - 0.005, its bytes <= target x theirs
#            (bench/lib/quality.py; cells with a `transform`)
# target None: the ratio is shown for information, nothing is judged.
METRICS = {"rps": ("rps", max, ">="), "rps_abs": ("rps", max, ">="),
           "cpu": ("cpu_us", min, "<="), "p99": ("p99_ms", min, "<="), "errors": (None, None, "=="),
           "lost": (None, None, "=="), "quality": ("ssim", None, ">=")}


def G(text, metric, against=(), target=None):
    assert metric in METRICS, metric
    return dict(text=text, metric=metric, against=list(against), target=target)


CEILING_HIT = 0.95  # larder's req/s against the ceiling's in every cached-hit cell


def ceiling_goal(what, target=CEILING_HIT):
    return G(f"{what}: larder >= {target:g}x the ceiling" if target else
             f"{what}: larder against the ceiling (no goal)", "rps", ["ceiling"], target)


def seed_goals(what, seed, target):
    """A cell's goal against the seed system itself (issue 44), with CPU per request beside it
    (for information): larder's req/s >= target x the seed's."""
    return [G(f"{what}: larder >= {target:g}x {seed}", "rps", [seed], target),
            G(f"{what}: CPU per request against {seed} (no goal)", "cpu", [seed])]
# Scenario imgproxy: a transform as the systems' URLs write it, from one description
# T(source file in bench/data, fill|fit, width, height (0: proportional), format, quality).
def T(src, mode, w, h, fmt, q):
    return dict(src=src, mode=mode, w=w, h=h, fmt=fmt, q=q)


def imgproxy_path(t, prefix="/"):
    """imgproxy's URL (no signature: `insecure`), the source read from bench/data (`local://`):
    imgproxy's IMGPROXY_LOCAL_FILESYSTEM_ROOT, larder's route `root`
    (bench/conf/larder-images.toml)."""
    return (f"{prefix}insecure/rs:{t['mode']}:{t['w']}:{t['h']}/q:{t['q']}/plain/"
            f"local:///{t['src']}"
            f"@{'jpg' if t['fmt'] == 'jpeg' else t['fmt']}")


# The imgproxy scenario's transforms: every request decoding (larder's `/` route), and again
# with the decoded original kept (`/kept/`).
IMGPROXY_TRANSFORMS = (
    ("photo-640x856.jpg", "fill", 100, 100, "jpeg", "640x856 -> 100x100 fill"),
    ("photo-640x856.jpg", "fill", 100, 100, "webp", "640x856 -> 100x100 fill"),
    ("photo-1000x872.jpg", "fit", 500, 0, "webp", "1000x872 -> 500 wide fit"),
    ("photo-1000x872.jpg", "fit", 500, 0, "avif", "1000x872 -> 500 wide fit"))


# The one place a system's image URL is chosen: both parse imgproxy's URL (larder's route reads
# the sources from bench/data, its `root`), so both do the same work for a request.
IMAGE_URL = {"larder-img": imgproxy_path, "imgproxy": imgproxy_path}


def image_cell(cid, label, t, conns, goals, systems=("larder-img", "imgproxy")):
    return dict(C(cid, label, conns, list(systems),
                  {s: IMAGE_URL[s](t) for s in systems if s in IMAGE_URL}, "image",
                  goals=goals), transform=t)


def scenario_cells(name):
    P = lambda p: {s: p for s in ("larder", "nginx", "varnish", "pike", "pingap")}  # noqa: E731
    if name == "pike":
        cells = []
        for enc, label, exp in (("gzip", "Accept-Encoding: gzip", "gzip"),
                                ("br", "Accept-Encoding: br, gzip", ("br", "gzip")),
                                ("identity", "no Accept-Encoding", None)):
            cells.append(C(f"pike-{enc}", f"/data.json 140 KB hit, {label}", 1000,
                           ["larder", "nginx", "varnish", "pike", "ceiling"], P("/data.json"),
                           "hit", AE[enc], exp, goals=[
                               G(f"pike {label}: larder >= 1.5x best anchor", "rps",
                                 ["nginx", "varnish"], 1.5),
                               *seed_goals(f"pike {label}", "pike",
                                           1.5 if enc == "identity" else 2.0),
                               ceiling_goal(f"pike {label}")]))
        # Large bodies (issue 44): 1 MB and 10 MB JSON generated at run time (Env.start_origin),
        # fewer connections (each response is a megabyte or ten in flight). Figures only, no
        # goals: CPU per request beside req/s, against the anchors and a ceiling that sends
        # the identity body as larder does (sendfile from a memfd).
        for size, conns in (("1m", 100), ("10m", 20)):
            for enc, label, exp in (("identity", "no Accept-Encoding", None),
                                    ("gzip", "Accept-Encoding: gzip", "gzip")):
                what = f"pike {size.upper()}B {label}"
                cells.append(C(f"pike-{size}-{enc}", f"/gen/large-{size}.json hit, {label}", conns,
                               ["larder", "nginx", "varnish", "ceiling"],
                               P(f"/gen/large-{size}.json"), "hit", AE[enc], exp, goals=[
                                   G(f"{what}: larder against the best anchor (no goal)", "rps",
                                     ["nginx", "varnish"]),
                                   G(f"{what}: CPU per request against the best anchor (no goal)",
                                     "cpu", ["nginx", "varnish"]),
                                   ceiling_goal(what, None)]))
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
              ["larder", "nginx", "pingap", "ceiling"],
              {"larder": "/ping", "nginx": "/ping", "pingap": "/ping"}, "fixed",
              goals=[G("pingap fixed response: larder >= 1.0x nginx return 200", "rps",
                       ["nginx"], 1.0),
                     *seed_goals("pingap fixed response", "pingap", 1.3),
                     G("pingap fixed response: CPU per request against nginx (no goal)", "cpu",
                       ["nginx"]),
                     ceiling_goal("pingap fixed response", None)]),
            C("pingap-8k-gzip", "/page.html 8 KB hit, Accept-Encoding: gzip", 100,
              ["larder", "nginx", "varnish", "pingap", "ceiling"], P("/page.html"), "hit",
              AE["gzip"], "gzip",
              goals=[G("pingap 8 KB hit, gzip: larder >= 1.3x best anchor", "rps",
                       ["nginx", "varnish"], 1.3),
                     *seed_goals("pingap 8 KB hit, gzip", "pingap", 2.0),
                             ceiling_goal("pingap 8 KB hit, gzip")]),
            C("pingap-8k-identity", "/page.html 8 KB hit, no Accept-Encoding", 100,
              ["larder", "nginx", "varnish", "pingap", "ceiling"], P("/page.html"), "hit", {},
              None,
              goals=[G("pingap 8 KB hit, identity: larder >= 1.3x best anchor", "rps",
                       ["nginx", "varnish"], 1.3),
                     *seed_goals("pingap 8 KB hit, identity", "pingap", 2.0),
                     ceiling_goal("pingap 8 KB hit, identity")]),
            C("pingap-nocache", "/nocache/page.html 8 KB uncacheable (proxied every time)", 10,
              ["larder", "nginx", "pingap"],
              {s: "/nocache/page.html" for s in ("larder", "nginx", "pingap")}, "pass", {}, None,
              goals=[G("pingap uncacheable proxied page: larder >= 1.0x nginx", "rps",
                       ["nginx"], 1.0),
                     *seed_goals("pingap uncacheable proxied page", "pingap", 1.3)]),
        ] + [
            C(f"pingap-otf-{enc}", f"24 KB uncacheable text compressed per request, {enc}", 10,
              ["larder", "nginx", "pingap"],
              {s: "/nocache/gen/text-24k.html" for s in ("larder", "nginx", "pingap")},
              "pass", hdr, enc,
              goals=[G(f"pingap on-the-fly {enc}: larder >= 1.0x nginx", "rps", ["nginx"], 1.0),
                     G(f"pingap on-the-fly {enc}: larder against pingap (no goal)", "rps",
                       ["pingap"]),
                     G(f"pingap on-the-fly {enc}: CPU per request against pingap (no goal)",
                       "cpu", ["pingap"])])
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
                  ["larder-img", "zimg", "thumbor"],
                  {"larder-img": "/@@MD5@@?w=100&h=100&g=1&f=jpeg",
                   "zimg": "/@@MD5@@?w=100&h=100&g=1&f=jpeg",
                   "thumbor": "/unsafe/100x100/filters:grayscale():format(jpeg)/photo-640x856.jpg"},
                  "image", goals=[G(f"zimg {n} conns: larder >= 1000 req/s uncached", "rps_abs",
                                    ["thumbor"], 1000),
                                  *seed_goals(f"zimg {n} conns", "zimg", 5.0)])
                for n in (10, 100, 500)] + [
            # The same transform with result caching on: a hit of a stored, prepared
            # response (compare with static-8k). thumbor stores no results by default.
            C(f"zimg-cached-{n}", f"the same, results cached (x-cache: HIT), {n} conns", n,
              ["larder-img", "ceiling"], {"larder-img": "/cached/@@MD5@@?w=100&h=100&g=1&f=jpeg"},
              "image", goals=[ceiling_goal(f"zimg cached {n} conns")])
            for n in (10, 100, 500)]
    if name == "imgproxy":
        cells = []
        for src, mode, w, h, fmt, what in IMGPROXY_TRANSFORMS:
            t = T(src, mode, w, h, fmt, 80)
            label = f"{what} {fmt.upper()} q80, uncached"
            cells.append(image_cell(
                f"imgproxy-{mode}-{fmt}", label, t, 10, goals=[
                    G(f"{label}: larder >= 4x imgproxy", "rps", ["imgproxy"], 4.0),
                    G(f"{label}: CPU per request against imgproxy (no goal)", "cpu",
                      ["imgproxy"]),
                    G(f"{label}: output at least as good: SSIM >= imgproxy's - 0.005 at <= 1.05x "
                      "its bytes", "quality", ["imgproxy"], 1.05)]))
        # The same transforms, results not cached but the decoded original kept (larder's
        # /kept/ route, decoded_cache): what a burst of variants of one original costs once
        # the first has decoded it. imgproxy decodes every request (it keeps no pixels).
        for src, mode, w, h, fmt, what in IMGPROXY_TRANSFORMS:
            t = T(src, mode, w, h, fmt, 80)
            label = f"{what} {fmt.upper()} q80, result uncached, decoded original kept"
            cells.append(dict(image_cell(
                f"imgproxy-kept-{mode}-{fmt}", label, t, 10, goals=[
                    G(f"{label}: larder >= 4x imgproxy", "rps", ["imgproxy"], 4.0),
                    G(f"{label}: CPU per request against imgproxy (no goal)", "cpu",
                      ["imgproxy"]),
                    G(f"{label}: output at least as good: SSIM >= imgproxy's - 0.005 at <= "
                      "1.05x its bytes", "quality", ["imgproxy"], 1.05)]),
                paths={"larder-img": imgproxy_path(t, "/kept/"), "imgproxy": imgproxy_path(t)}))

        # replaying it.
        t = T("photo-640x856.jpg", "fill", 100, 100, "webp", 80)
        cells.append(dict(image_cell(
            "imgproxy-cached-webp", "640x856 -> 100x100 fill WEBP q80, result cached "
            "(x-cache: HIT)", dict(t), 100, goals=[ceiling_goal("cached WebP variant")],
            systems=("larder-img", "ceiling")), cached=True,
            paths={"larder-img": imgproxy_path(t, "/cached/"), "ceiling": "/"}))
        return cells
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
    if name == "rules":
        # `bench:bench`, the user of the members' file both systems read
        auth = {"Authorization": "Basic YmVuY2g6YmVuY2g="}
        return [
            C("rules-8k-edge", "/edge/page.html 8 KB hit behind basic auth + a rate limit + "
              "3 header rules (larder-bare: /page.html, the same hit without rules)", 100,
              ["larder-rules", "larder-bare", "nginx-rules", "ceiling"],
              {"larder-rules": "/edge/page.html", "larder-bare": "/page.html",
               "nginx-rules": "/edge/page.html"}, "hit", auth, None,
              goals=[G("rules 8 KB hit behind auth + limit + headers: larder >= 0.9x the same "
                       "hit without rules", "rps", ["larder-bare"], 0.9),
                     G("rules: CPU per request against the same hit without rules (no goal)",
                       "cpu", ["larder-bare"]),
                     G("rules 8 KB hit: larder >= 1.3x nginx auth_basic + limit_req + "
                       "add_header", "rps", ["nginx-rules"], 1.3),
                     G("rules: CPU per request against nginx (no goal)", "cpu",
                       ["nginx-rules"]),
                     ceiling_goal("rules 8 KB hit", None)]),
        ]
    raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")


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
            if metric == "quality":
                b = g["against"][0]
                mine = (res.get(lname) or {}).get("quality")
                theirs = (res.get(b) or {}).get("quality")
                row["baseline_system"] = b
                if not mine or not theirs:
                    row["note"] = "not measured (" + ", ".join(
                        f"{s}: {(res.get(s) or {}).get('skipped') or 'no output'}"
                        for s, q in ((lname, mine), (b, theirs)) if not q) + ")"
                    continue
                row["larder"], row["baseline"] = mine.get("ssim"), theirs.get("ssim")
                row["ratio"] = mine["bytes"] / theirs["bytes"] if theirs["bytes"] else None
                row["met"], row["note"] = judge(mine, theirs, target)
                continue
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
            # a seed system whose binary is not named is skipped at once
            systems = [s for s in systems if s not in ANCHORS or os.environ.get(ANCHORS[s][0])]
            # cells a system is known to be unable to serve are not run
            if c["id"] == "pingap-otf-zstd":
                systems = [s for s in systems if s != "nginx"]
            if c["id"] == "pingap-otf-br" and not BROTLI_MODULE.exists():
                systems = [s for s in systems if s != "nginx"]
            n += len(systems)
    est = FIXED_OVERHEAD_S + n * PAIR_OVERHEAD_S + n * reps * (duration + RUN_OVERHEAD_S)
    return est, n
