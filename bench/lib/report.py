"""The report: markdown tables, charts (matplotlib, when bench/.venv has it), the results
section of docs/benchmarks.md, and the results files of the scenarios that run on their own.
"""

import json
import re

from .common import ANCHORS, DOC, REPO, RESULTS, SCENARIOS, log, warn
from .quality import SSIM_SLACK, describe
from .scenarios import METRICS


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
            "lost": f"{v} lost", "quality": f"SSIM {v:.4f}"}[metric]


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
        if metric == "quality" and g["ratio"] is not None:
            ratio += " bytes"
        t = g["target"]
        tgt = ("0" if metric == "errors" else "-" if t is None else
               f"SSIM >= -{SSIM_SLACK:g}, bytes <= {t:g}x" if metric == "quality" else
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
                q = r.get("quality") or {}
                if "ssim" in q:  # scenario imgproxy: the output against the float reference
                    served = f"{q['size']} {q['format']}, {describe(q)}"
                elif q.get("error"):
                    served = f"{chk.get('format')}, quality {q['error']}"
                elif chk.get("format") and not chk.get("jpeg"):
                    served = chk["format"]
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
    versions = [f"{s} {v}" if not v.startswith(s.split("-")[0]) else v
                for s, v in (doc.get("versions") or {}).items() if v and s != "ceiling"]
    if versions:
        L.append("Versions: " + "; ".join(versions) + ".")
        L.append("")
    if doc["goals"]:
        L += goals_table(doc["goals"], doc["scenario"])
        L.append("")
    if doc.get("skipped_systems"):
        for s, why in doc["skipped_systems"].items():
            L.append(f"- {s} skipped: {why}")
        L.append("")
    return "\n".join(L)


COLORS = {"larder": "#d62728", "larder-img": "#d62728", "nginx": "#2ca02c", "imgproxy": "#8c564b",
          "nginx-debian": "#98df8a", "varnish": "#1f77b4", "thumbor": "#9467bd",
          "ceiling": "#7f7f7f", "hyper": "#ff7f0e",
          "larder-tls": "#d62728", "larder-hs-rsa": "#d62728", "larder-hs-ecdsa": "#d62728",
          "nginx-tls": "#2ca02c", "nginx-hs-rsa": "#2ca02c", "nginx-hs-ecdsa": "#2ca02c",
          # the seed systems themselves (issue 44)
          "pingap": "#e377c2", "pike": "#17becf", "zimg": "#bcbd22"}


def legend_label(doc, s):
    """A system's name in a chart's legend; a seed system's with its version (pingap 0.13.1)."""
    v = (doc.get("versions") or {}).get(s, "")
    return v if s in ANCHORS and v else s


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
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                            label=legend_label(doc, s), color=COLORS.get(s))
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
                ax.bar(xs, ys, width=w, label=legend_label(doc, s), color=COLORS.get(s))
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
