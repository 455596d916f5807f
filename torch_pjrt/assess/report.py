"""Renders an assessment's report.json (schema v1, see schema.md) as report.md and report.html.

    render(report_dict, out_dir) -> {"md": ".../report.md", "html": ".../report.html"}

report.html is one self-contained file: inline CSS, plots as inline SVG (matplotlib,
no pyplot, so no global backend is touched), no scripts, no external URLs.
report.md has the same content as Markdown tables (no images).

Both are rendered from the JSON alone and never raise on a partial report: a
section whose data is null, missing or malformed says "not run: <reason>", the
reason taken from the stage's entry in `stages`. Only I/O errors on out_dir raise.

Re-render an old report:  python -m torch_pjrt.assess.report DIR/report.json [--out DIR]
(importing the torch_pjrt package loads its extension; without one, run the file itself:
python torch_pjrt/assess/report.py DIR/report.json -- it needs only jinja2 and matplotlib).
"""
from __future__ import annotations

import argparse
import functools
import io
import json
import math
import os
import re
import sys
import warnings

import jinja2
from markupsafe import Markup

SCHEMA_VERSION = 1
TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")

# Section ids and headings, in the order both documents show them.
SECTIONS = [
    ("verdict", "Verdict & criteria"),
    ("failures", "Failures"),
    ("inventory", "Inventory"),
    ("coverage", "Op coverage"),
    ("numerics", "Numerics"),
    ("performance", "Performance"),
    ("memory", "Memory"),
    ("readiness", "TPU readiness (estimate)"),
    ("cost", "Cost"),
    ("environment", "Environment & settings"),
]

VERDICTS = {"ready": "ready", "ready after listed changes": "changes", "not ready": "not-ready"}
FAILURE_KINDS = [
    ("out_of_memory", "Out of memory"),
    ("unsupported_op", "Unsupported op"),
    ("compile_error", "Compile error"),
    ("numerics_mismatch", "Numerics mismatch"),
    ("runtime_error", "Runtime error"),
    ("timeout", "Timeout"),
    ("workload_error", "Workload error (fails on the baseline too)"),
]
OP_CLASSES = ["failing", "cpu_fallback", "decomposed", "lowered"]
OP_CLASS_LABELS = {"failing": "failing", "cpu_fallback": "CPU fallback", "decomposed": "decomposed",
                   "lowered": "lowered"}
EFFORTS = ["rewrite", "replace", "trivial"]
PHASES = [("process_start", "process start"), ("import", "import"), ("model_load", "model load"),
          ("first_call", "first call (compile)"), ("steady_call", "steady call")]
MAX_ERROR_CHARS = 4000
MAX_ERROR_LINES = 40
MAX_HIST_LINES = 8      # outputs drawn per error-histogram panel
MAX_PLOT_SAMPLES = 2000  # latency samples per box (more: evenly spaced order statistics)

# Plot colours: one per frontend (the baseline grey), so every plot reads the same way.
FRONTEND_COLORS = {"baseline": "#6e7781", "eager": "#0969da", "compiled": "#8250df"}
EXTRA_COLORS = ["#bc4c00", "#1b7c83", "#bf3989", "#4d2d00", "#0550ae"]
PHASE_COLORS = ["#afb8c1", "#54aeff", "#a475f9", "#fb8f44", "#2da44e"]
FULL_W, HALF_W = 11.0, 6.8  # inches: at the page's width the plots show at about 1:1


# --------------------------------------------------------------------------- values

def _d(x):
    return x if isinstance(x, dict) else {}


def _dl(x):
    """The dicts of a list (anything else: empty)."""
    return [e for e in x if isinstance(e, dict)] if isinstance(x, list) else []


def _num(x):
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def _finite(x):
    v = _num(x)
    return v if v is not None and math.isfinite(v) else None


def _str(x):
    if x is None:
        return ""
    return x if isinstance(x, str) else json.dumps(x, default=str) if isinstance(x, (list, dict)) else str(x)


def _strs(x):
    return [_str(e) for e in x if e is not None] if isinstance(x, list) else ([] if x is None else [_str(x)])


def _int_key(x):
    v = _num(x)
    return (0, v) if v is not None else (1, _str(x))


DASH = "\u2014"


def fmt_num(x, digits=3):
    v = _num(x)
    if v is None:
        return DASH if x is None else _str(x)
    if not math.isfinite(v):
        return str(v)
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def fmt_int(x):
    v = _num(x)
    if v is None:
        return DASH if x is None else _str(x)
    return f"{int(round(v)):,}" if math.isfinite(v) else str(v)


def fmt_sci(x):
    v = _num(x)
    if v is None:
        return DASH if x is None else _str(x)
    if v == 0:
        return "0"
    return f"{v:.2e}" if math.isfinite(v) else str(v)


def fmt_cos(x):
    v = _num(x)
    if v is None:
        return DASH if x is None else _str(x)
    if not math.isfinite(v):
        return str(v)
    s = f"{v:.8f}".rstrip("0")
    return s + "0" if s.endswith(".") else s


def fmt_pct(x, digits=2):
    """A share (0..1) as a percentage."""
    v = _num(x)
    if v is None:
        return DASH if x is None else _str(x)
    if not math.isfinite(v):
        return str(v)
    p = v * 100
    if p == 0:
        return "0 %"
    if abs(p) < 0.01:
        return f"{p:.1e} %"
    return f"{p:.{digits}f} %"


def fmt_secs(x):
    v = _num(x)
    if v is None:
        return DASH if x is None else _str(x)
    if not math.isfinite(v):
        return str(v)
    a = abs(v)
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{v * 1e6:.3g} \u00b5s"
    if a < 1:
        return f"{v * 1e3:.3g} ms"
    if a < 100:
        return f"{v:.3g} s"
    return f"{v:,.0f} s"


def fmt_bytes(x):
    v = _num(x)
    if v is None:
        return DASH if x is None else _str(x)
    if not math.isfinite(v):
        return str(v)
    for unit, scale in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}" if v / scale < 1000 else f"{v / scale:,.0f} {unit}"
    return f"{int(v)} B"


def fmt_money(x, currency=""):
    v = _num(x)
    if v is None:
        return DASH if x is None else _str(x)
    if not math.isfinite(v):
        return str(v)
    s = f"{v:#.3g}" if abs(v) < 1 else f"{v:,.2f}"
    return f"{s} {currency}".strip()


def fmt_value(x):
    """A config value as report.json spells it."""
    if isinstance(x, str):
        return x
    try:
        return json.dumps(x, default=str)
    except (TypeError, ValueError):
        return str(x)


def fmt_pass(x):
    return "pass" if x is True else "fail" if x is False else "n/a"


def pass_class(x):
    return "pass" if x is True else "fail" if x is False else "na"


# ------------------------------------------------------------------- missing data

class _Stages:
    def __init__(self, report):
        self.present = isinstance(report.get("stages"), list)
        self.by_name = {}
        for s in _dl(report.get("stages")):
            self.by_name.setdefault(_str(s.get("name")), s)

    def reason(self, name):
        """Why section `name` has no data: "not run: <reason>"."""
        s = self.by_name.get(name)
        if s is None:
            why = (f"no '{name}' stage in the report" if self.present
                   else "the report has no stage list")
        else:
            status = _str(s.get("status")) or "unknown"
            r = _str(s.get("reason"))
            if status == "failed":
                why = f"the {name} stage failed" + (f": {r}" if r else " (no reason recorded)")
            elif status == "skipped":
                why = f"the {name} stage was skipped" + (f": {r}" if r else " (no reason recorded)")
            else:
                why = r or f"the {name} stage (status {status}) recorded no data"
        return "not run: " + why


def _missing(reason):
    return {"ok": False, "reason": reason}


# ------------------------------------------------------------------------- plots

def _frontend_colors(names):
    out, extra = {}, iter(EXTRA_COLORS * 4)
    for n in names:
        out[n] = FRONTEND_COLORS.get(n) or next(extra, "#57606a")
    return out


def _ordered_frontends(names):
    seen = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return sorted(seen, key=lambda n: (n != "baseline", n != "eager", n != "compiled"))


_RC = {
    "font.size": 10, "axes.titlesize": 11, "axes.titleweight": "bold", "axes.labelsize": 10,
    "axes.spines.top": False, "axes.spines.right": False, "axes.edgecolor": "#8c959f",
    "axes.grid": True, "grid.color": "#d8dee4", "grid.linewidth": 0.6, "axes.axisbelow": True,
    "xtick.color": "#424a53", "ytick.color": "#424a53", "axes.labelcolor": "#24292f",
    "legend.frameon": False, "legend.fontsize": 9, "svg.fonttype": "path",
    "figure.facecolor": "white", "savefig.facecolor": "white",
}


def _figure(w, h, ncols=1):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(w, h), dpi=100, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _svg(fig, key, label):
    """The figure as an inline <svg> element: unique ids per plot, no XML prologue or metadata."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    s = buf.getvalue()
    s = s[s.find("<svg"):]
    s = re.sub(r"<metadata>.*?</metadata>\s*", "", s, flags=re.S)
    s = re.sub(r"<!--.*?-->", "", s, flags=re.S)  # the text of each label (escaped), not needed
    ids = set(re.findall(r'\bid="([^"]+)"', s))
    prefix = f"plot-{key}-"

    def fix_ref(m):
        return m.group(1) + (prefix + m.group(2) if m.group(2) in ids else m.group(2)) + m.group(3)
    s = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', s)
    s = re.sub(r'(#)([^"\)\s]+)(["\)])', fix_ref, s)
    esc = label.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    s = s.replace("<svg ", f'<svg class="plot" role="img" aria-label="{esc}" ', 1)
    return Markup(s)


def _plot(key, label, fn, *args):
    """{"key", "label", "svg"} or {"key", "label", "error"}; never raises."""
    import matplotlib
    try:
        with matplotlib.rc_context({**_RC, "svg.hashsalt": key}), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fig = fn(*args)
            if fig is None:
                return None
            return {"key": key, "label": label, "svg": _svg(fig, key, label)}
    except Exception as e:  # a plot never takes the report down
        return {"key": key, "label": label, "error": f"{type(e).__name__}: {e}"}


def _batch_axis(ax, batches):
    batches = sorted({b for b in batches if b is not None and b > 0})
    if batches and max(batches) / min(batches) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(batches)
    ax.set_xticklabels([fmt_int(b) for b in batches])
    ax.minorticks_off()
    ax.set_xlabel("batch size")


def _plot_histograms(outputs):
    frontends = _ordered_frontends([o["frontend"] or "?" for o in outputs if o["hist"]])
    if not frontends:
        return None
    fig, axes = _figure(FULL_W, 3.4, len(frontends))
    palette = EXTRA_COLORS[:1] + ["#0969da", "#8250df", "#1b7c83", "#bf3989", "#4d2d00", "#cf222e", "#6e7781"]
    for ax, fe in zip(axes, frontends):
        atols = set()
        mine = [x for x in outputs if (x["frontend"] or "?") == fe and x["hist"]]
        # the failing outputs and the largest errors first; a legend of MAX_HIST_LINES at most
        shown = sorted(mine, key=lambda o: (o["pass"] is not False, -(_finite(o["max_abs"]) or 0)))[:MAX_HIST_LINES]
        for i, o in enumerate(x for x in mine if any(x is y for y in shown)):
            edges, counts = o["hist"]
            total = sum(counts) or 1
            ax.stairs([c / total for c in counts], edges, label=o["name"] or f"output {i}",
                      color=palette[i % len(palette)], linewidth=1.4)
            a = _finite(o["atol"])
            if a and a > 0:
                atols.add(a)
        if len(atols) == 1:
            ax.axvline(math.log10(atols.pop()), color="#cf222e", linestyle="--", linewidth=1)
            ax.text(0.99, 0.97, "atol", transform=ax.get_xaxis_transform(), ha="right", va="top",
                    color="#cf222e", fontsize=8)
        ax.set_title(f"{fe}: |error| vs baseline" + (f" ({len(shown)} of {len(mine)} outputs)"
                                                     if len(mine) > len(shown) else ""))
        ax.set_xlabel("log10 |abs error|")
        ax.set_ylabel("share of elements")
        ax.legend(loc="best")
    return fig


def _plot_loss(curves):
    from matplotlib.ticker import MaxNLocator
    names = _ordered_frontends(list(curves))
    colors = _frontend_colors(names)
    base = curves.get("baseline")
    fig, axes = _figure(FULL_W, 3.4, 2 if base else 1)
    ax = axes[0]
    for n in names:
        ys = curves[n]
        ax.plot(range(1, len(ys) + 1), ys, label=n, color=colors[n],
                linewidth=2.6 if n == "baseline" else 1.4, linestyle="-" if n == "baseline" else "--",
                alpha=0.55 if n == "baseline" else 1, marker=None if n == "baseline" else "o", markersize=3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("training loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    if base:
        ax = axes[1]
        for n in names:
            if n == "baseline":
                continue
            ys = curves[n]
            k = min(len(ys), len(base))
            ax.plot(range(1, k + 1), [ys[i] - base[i] for i in range(k)], label=n, color=colors[n],
                    marker="o", markersize=3, linewidth=1.4)
        ax.axhline(0, color="#6e7781", linewidth=1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title("difference from baseline")
        ax.set_xlabel("step")
        ax.set_ylabel("loss \u2212 baseline loss")
        ax.legend()
    return fig


def _plot_cold_start(rows):
    rows = [r for r in rows if any(_finite(r.get(k)) for k, _ in PHASES)]
    if not rows:
        return None
    fig, (ax,) = _figure(FULL_W, 1.5 + 0.36 * len(rows))
    labels = [f"{_str(r.get('frontend')) or '?'} \u00b7 {_str(r.get('cache')) or '?'}" for r in rows]
    left = [0.0] * len(rows)
    y = list(range(len(rows)))
    for (k, name), color in zip(PHASES, PHASE_COLORS):
        w = [max(_finite(r.get(k)) or 0.0, 0.0) for r in rows]
        ax.barh(y, w, left=left, color=color, label=name, height=0.62, edgecolor="white", linewidth=0.5)
        left = [a + b for a, b in zip(left, w)]
    xmax = max(left) or 1
    for i, r in enumerate(rows):
        tot = _finite(r.get("total"))
        ax.text(left[i] + xmax * 0.01, i, fmt_secs(tot if tot is not None else left[i]), va="center", fontsize=9)
    ax.set_xlim(0, xmax * 1.12)
    ax.set_yticks(y)
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("seconds from process start")
    ax.set_title("cold start: time to the first result, by phase")
    ax.legend(ncols=len(PHASES), loc="upper center", bbox_to_anchor=(0.5, -0.22 - 0.5 / (1 + len(rows))))
    return fig


def _plot_latency(rows):
    rows = [r for r in rows if (r["samples"] or r["p50"] is not None) and _finite(r["batch_size"]) is not None]
    if not rows:
        return None
    frontends = _ordered_frontends([r["frontend"] for r in rows])
    colors = _frontend_colors(frontends)
    batches = sorted({r["batch_size"] for r in rows}, key=_int_key)
    fig, (ax,) = _figure(FULL_W, 3.6)
    width = 0.8 / len(frontends)
    values = []
    for j, fe in enumerate(frontends):
        for r in rows:
            if r["frontend"] != fe:
                continue
            x = batches.index(r["batch_size"]) - 0.4 + width * (j + 0.5)
            ms = [v * 1e3 for v in r["samples"]]
            if ms:
                values += ms
                bp = ax.boxplot([ms], positions=[x], widths=width * 0.8, patch_artist=True, manage_ticks=False,
                                flierprops={"marker": ".", "markersize": 3, "markeredgecolor": colors[fe]},
                                medianprops={"color": "white", "linewidth": 1.2},
                                whiskerprops={"color": colors[fe]}, capprops={"color": colors[fe]})
                for patch in bp["boxes"]:
                    patch.set(facecolor=colors[fe], edgecolor=colors[fe], alpha=0.85)
            else:  # percentiles only: p50 marker, line to p99
                p = [r[k] * 1e3 for k in ("p50", "p95", "p99") if r[k] is not None]
                values += p
                ax.plot([x] * len(p), p, color=colors[fe], marker="D", markersize=4, linewidth=1.2)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=colors[f], label=f) for f in frontends], loc="upper left")
    pos = [v for v in values if v > 0]
    if pos and max(pos) / min(pos) > 30:
        ax.set_yscale("log")
    ax.set_xticks(range(len(batches)))
    ax.set_xticklabels([fmt_int(b) for b in batches])
    ax.set_xlim(-0.6, len(batches) - 0.4)
    ax.grid(axis="x", visible=False)
    ax.set_xlabel("batch size")
    ax.set_ylabel("latency per call (ms)")
    ax.set_title("latency distribution per batch size")
    return fig


def _plot_throughput(rows):
    rows = [r for r in rows if r["items_per_s"] is not None and _finite(r["batch_size"])]
    if not rows:
        return None
    frontends = _ordered_frontends([r["frontend"] for r in rows])
    colors = _frontend_colors(frontends)
    fig, (ax,) = _figure(FULL_W, 3.4)
    for fe in frontends:
        pts = sorted((r["batch_size"], r["items_per_s"]) for r in rows if r["frontend"] == fe)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=4, label=fe, color=colors[fe],
                linewidth=1.6)
    _batch_axis(ax, [r["batch_size"] for r in rows])
    vals = [r["items_per_s"] for r in rows if r["items_per_s"] > 0]
    if vals and max(vals) / min(vals) > 30:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_ylabel("items / s")
    ax.set_title("throughput vs batch size")
    ax.legend(loc="upper left")
    return fig


def _unit(v):
    for unit, scale in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if v >= scale:
            return unit, scale
    return "B", 1


def _plot_memory(rows, limit):
    pts = [(r["batch_size"], r["peak"]) for r in rows if r["peak"] is not None and _finite(r["batch_size"])]
    ooms = [r["batch_size"] for r in rows if r["oom"] and _finite(r["batch_size"])]
    if not pts and not ooms:
        return None
    top = max([p for _, p in pts] + ([limit] if limit else []) + [1])
    unit, scale = _unit(top)
    fig, (ax,) = _figure(HALF_W, 3.4)
    if pts:
        pts.sort()
        ax.plot([b for b, _ in pts], [p / scale for _, p in pts], marker="o", markersize=4, color="#0969da",
                linewidth=1.6, label="peak memory")
    if limit:
        ax.axhline(limit / scale, color="#cf222e", linestyle="--", linewidth=1.2, label=f"limit {fmt_bytes(limit)}")
    if ooms:
        y = (limit or top) / scale
        ax.plot(ooms, [y] * len(ooms), linestyle="none", marker="X", markersize=9, color="#cf222e",
                label="out of memory")
        for b in ooms:
            ax.annotate("OOM", (b, y), textcoords="offset points", xytext=(0, -14), ha="center", fontsize=9,
                        color="#cf222e", fontweight="bold")
    _batch_axis(ax, [b for b, _ in pts] + ooms)
    ax.set_ylim(0, top / scale * 1.15)
    ax.set_ylabel(f"peak device memory ({unit})")
    ax.set_title("peak memory vs batch size")
    ax.legend(loc="lower right")
    return fig


# ---------------------------------------------------------------------- sections

def _guard(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # a malformed section never takes the report down
        return _missing(f"could not render this section ({type(e).__name__}: {e})")


def _verdict(report, stages):
    v = report.get("verdict")
    if not isinstance(v, dict) or not v:
        return {**_missing(stages.reason("verdict")), "overall": None, "css": "unknown",
                "criteria": [], "blocking": [], "changes": [], "not_measured": []}
    overall = _str(v.get("overall")).strip() or None
    crit = [{"name": _str(c.get("name")), "pass": c.get("pass"), "value": _str(c.get("value")),
             "threshold": _str(c.get("threshold")), "detail": _str(c.get("detail"))}
            for c in _dl(v.get("criteria"))]
    return {"ok": True, "overall": overall, "css": VERDICTS.get((overall or "").lower(), "unknown"),
            "criteria": crit, "blocking": _strs(v.get("blocking")), "changes": _strs(v.get("changes")),
            "not_measured": _strs(v.get("not_measured"))}


def _trim_error(text):
    text = _str(text)
    lines = text.splitlines()
    note = None
    if len(lines) > MAX_ERROR_LINES:
        text = "\n".join(lines[:MAX_ERROR_LINES])
        note = f"{len(lines) - MAX_ERROR_LINES} more lines not shown"
    if len(text) > MAX_ERROR_CHARS:
        note = f"{len(_str(text)) - MAX_ERROR_CHARS:,} more characters not shown" + (f"; {note}" if note else "")
        text = text[:MAX_ERROR_CHARS]
    return text, note


def _failures(report, stages):
    raw = report.get("failures")
    if not isinstance(raw, list):
        return {"ok": False, "reason": "the report has no failure list", "groups": [], "count": 0}
    groups = {}
    for f in _dl(raw):
        kind = _str(f.get("kind")) or "unknown"
        err, note = _trim_error(f.get("error"))
        groups.setdefault(kind, []).append({
            "stage": _str(f.get("stage")), "frontend": _str(f.get("frontend")),
            "batch_size": f.get("batch_size"), "op": _str(f.get("op")), "error": err, "error_note": note,
            "next_step": _str(f.get("next_step"))})
    labels = dict(FAILURE_KINDS)
    order = [k for k, _ in FAILURE_KINDS if k in groups] + sorted(k for k in groups if k not in labels)
    out = [{"kind": k, "label": labels.get(k, k.replace("_", " ").capitalize()), "entries": groups[k]}
           for k in order]
    return {"ok": True, "groups": out, "count": sum(len(g["entries"]) for g in out)}


def _inventory(report, stages):
    inv = report.get("inventory")
    if not isinstance(inv, dict):
        return _missing(stages.reason("inventory"))
    items = [{"location": _str(i.get("file")) + (f":{i.get('line')}" if i.get("line") is not None else ""),
              "kind": _str(i.get("kind")), "detail": _str(i.get("detail")), "effort": _str(i.get("effort")),
              "suggestion": _str(i.get("suggestion")), "_line": i.get("line")}
             for i in _dl(inv.get("items"))]
    rank = {e: n for n, e in enumerate(EFFORTS)}
    items.sort(key=lambda i: (rank.get(i["effort"], len(rank)), i["location"].rsplit(":", 1)[0],
                              _int_key(i["_line"])))
    summary = _d(inv.get("summary"))
    counts = [(e, summary.get(e) if e in summary else sum(1 for i in items if i["effort"] == e))
              for e in reversed(EFFORTS)]
    return {"ok": True, "files_scanned": inv.get("files_scanned"),
            "packages": _strs(inv.get("packages_scanned")), "entries": items, "summary": counts}


def _coverage(report, stages):
    cov = report.get("coverage")
    if not isinstance(cov, dict):
        return _missing(stages.reason("coverage"))
    ops = [{"op": _str(o.get("op")), "count": o.get("count"), "class": _str(o.get("class")),
            "seconds": o.get("seconds")} for o in _dl(cov.get("ops"))]
    rank = {c: n for n, c in enumerate(OP_CLASSES)}
    ops.sort(key=lambda o: (rank.get(o["class"], len(rank)), -(_finite(o["count"]) or 0), o["op"]))
    summary = _d(cov.get("summary"))
    classes = []
    for c in OP_CLASSES + sorted({o["class"] for o in ops} - set(OP_CLASSES)):
        mine = [o for o in ops if o["class"] == c]
        n = summary.get(c) if c in summary else len(mine)
        calls = sum(_finite(o["count"]) or 0 for o in mine) if mine else None
        secs = [_finite(o["seconds"]) for o in mine if _finite(o["seconds"]) is not None]
        classes.append({"class": c, "label": OP_CLASS_LABELS.get(c, c), "ops": n, "calls": calls,
                        "seconds": sum(secs) if secs else None})
    n_total = sum(_finite(c["ops"]) or 0 for c in classes)
    for c in classes:
        c["share"] = (_finite(c["ops"]) or 0) / n_total if n_total else 0
    breaks = [{"reason": _str(b.get("reason")), "frames": _strs(b.get("user_frames"))}
              for b in _dl(cov.get("graph_breaks"))]
    recompiles = [{"batch_size": r.get("batch_size"), "graph": _str(r.get("graph")), "reason": _str(r.get("reason"))}
                  for r in _dl(cov.get("recompiles"))]
    return {"ok": True, "ops": ops, "classes": classes, "distinct_ops": n_total,
            "total_calls": summary.get("total_calls"), "fallback_time_share": cov.get("fallback_time_share"),
            "graph_breaks": breaks, "graphs": cov.get("graphs"), "recompiles": recompiles,
            "has_breaks": isinstance(cov.get("graph_breaks"), list),
            "has_recompiles": isinstance(cov.get("recompiles"), list)}


def _histogram(h):
    h = _d(h)
    edges, counts = h.get("edges_log10"), h.get("counts")
    if not isinstance(edges, list) or not isinstance(counts, list):
        return None
    pairs = []
    for i in range(min(len(edges) - 1, len(counts))):
        lo, hi, c = _finite(edges[i]), _finite(edges[i + 1]), _finite(counts[i])
        if lo is None or hi is None or c is None or hi <= lo:
            continue
        if pairs and pairs[-1][1] != lo:  # a gap: start a fresh run only if contiguous
            continue
        pairs.append((lo, hi, c))
    if not pairs or not sum(c for *_, c in pairs):
        return None
    return [pairs[0][0]] + [hi for _, hi, _ in pairs], [c for *_, c in pairs]


def _numerics(report, stages):
    num = report.get("numerics")
    if not isinstance(num, dict):
        return _missing(stages.reason("numerics"))
    outputs = []
    for o in _dl(num.get("outputs")):
        shape = o.get("shape")
        outputs.append({
            "frontend": _str(o.get("frontend")), "name": _str(o.get("name")), "dtype": _str(o.get("dtype")),
            "shape": ("(" + ", ".join(_str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")")
            if isinstance(shape, list) else _str(shape),
            "max_abs": o.get("max_abs"), "max_rel": o.get("max_rel"), "cosine": o.get("cosine"),
            "out_of_tolerance": o.get("out_of_tolerance"), "rtol": o.get("rtol"), "atol": o.get("atol"),
            "pass": o.get("pass"), "hist": _histogram(o.get("abs_error_histogram")),
            "note": _str(o.get("note") or o.get("error")) or None})
    tm = num.get("task_metric")
    tm = ({"name": _str(tm.get("name")), "baseline": tm.get("baseline"), "target": tm.get("target"),
           "threshold": tm.get("threshold"), "pass": tm.get("pass"),
           "reference": bool(tm.get("baseline_is_reference"))} if isinstance(tm, dict) else None)
    w = _d(report.get("workload"))
    mode = _str(w.get("mode"))
    if tm is not None:
        tm_reason = None
    elif w.get("task_metric"):
        tm_reason = f"the task metric ({_str(w.get('task_metric'))}) was not measured"
    else:
        tm_reason = "no task metric configured for this workload"
    curves = {}
    for k, ys in _d(num.get("loss_curve")).items():
        ys = [_finite(y) for y in ys] if isinstance(ys, list) else []
        if ys and all(y is not None for y in ys):
            curves[_str(k)] = ys
    plots = []
    if any(o["hist"] for o in outputs):
        plots.append(_plot("hist", "absolute error histograms per output", _plot_histograms, outputs))
    if curves:
        plots.append(_plot("loss", "loss curves, target vs baseline", _plot_loss, curves))
    if curves:
        loss_reason = None
    elif mode and mode != "training":
        loss_reason = f"{mode} workload: no loss curve"
    else:
        loss_reason = "no loss curve recorded"
    return {"ok": True, "pass": num.get("pass"), "note": _str(num.get("note")) or None,
            "baseline_device": _str(num.get("baseline_device")),
            "frontends": _strs(num.get("frontends")), "outputs": outputs, "task_metric": tm,
            "task_metric_reason": tm_reason, "loss_reason": loss_reason,
            "hist_reason": None if any(o["hist"] for o in outputs) else "no error histograms recorded",
            "plots": [p for p in plots if p]}


def _performance(report, stages):
    perf = report.get("performance")
    if not isinstance(perf, dict):
        return _missing(stages.reason("performance"))
    cold = [{"frontend": _str(r.get("frontend")), "cache": _str(r.get("cache")),
             **{k: r.get(k) for k, _ in PHASES}, "total": r.get("total")} for r in _dl(perf.get("cold_start"))]
    lat = []
    for r in _dl(perf.get("latency")):
        samples = r.get("samples")
        samples = [v for v in (_finite(s) for s in samples) if v is not None] if isinstance(samples, list) else []
        if len(samples) > MAX_PLOT_SAMPLES:
            samples.sort()
            step = (len(samples) - 1) / (MAX_PLOT_SAMPLES - 1)
            samples = [samples[round(i * step)] for i in range(MAX_PLOT_SAMPLES)]
        lat.append({"frontend": _str(r.get("frontend")) or "?", "batch_size": r.get("batch_size"),
                    "p50": _finite(r.get("p50")), "p95": _finite(r.get("p95")), "p99": _finite(r.get("p99")),
                    "n": r.get("n"), "samples": samples})
    thr = [{"frontend": _str(r.get("frontend")) or "?", "batch_size": r.get("batch_size"),
            "items_per_s": _finite(r.get("items_per_s"))} for r in _dl(perf.get("throughput"))]
    # one table: latency percentiles and throughput per (frontend, batch size)
    rows = {}
    for r in lat:
        rows[(r["frontend"], _str(r["batch_size"]))] = {**r, "items_per_s": None}
    for r in thr:
        key = (r["frontend"], _str(r["batch_size"]))
        rows.setdefault(key, {"frontend": r["frontend"], "batch_size": r["batch_size"], "p50": None, "p95": None,
                              "p99": None, "n": None, "samples": []})["items_per_s"] = r["items_per_s"]
    order = _ordered_frontends([k[0] for k in rows])
    table = sorted(rows.values(), key=lambda r: (order.index(r["frontend"]), _int_key(r["batch_size"])))
    plots = {
        "cold": cold and _plot("cold", "cold-start phases per frontend and cache state", _plot_cold_start, cold),
        "latency": lat and _plot("latency", "latency distribution per batch size and frontend", _plot_latency, lat),
        "throughput": thr and _plot("throughput", "throughput vs batch size", _plot_throughput, thr),
    }
    return {"ok": True, "cold": cold, "table": table, "plots": plots,
            "cold_reason": None if cold else "no cold-start measurements recorded",
            "table_reason": None if table else "no latency or throughput measurements recorded"}


def _memory(report, stages):
    mem = report.get("memory")
    if not isinstance(mem, dict):
        return _missing(stages.reason("memory"))
    limit = _finite(mem.get("limit_bytes"))
    rows = []
    for r in sorted(_dl(mem.get("per_batch")), key=lambda r: _int_key(r.get("batch_size"))):
        peak = _finite(r.get("peak_bytes"))
        status = _str(r.get("status"))
        rows.append({"batch_size": r.get("batch_size"), "peak": peak, "status": status,
                     "oom": status == "out_of_memory",
                     "share": peak / limit if peak is not None and limit else None})
    plot = _plot("memory", "peak memory vs batch size with the limit", _plot_memory, rows, limit) if rows else None
    return {"ok": True, "rows": rows, "limit": mem.get("limit_bytes"), "largest_batch": mem.get("largest_batch"),
            "first_oom_batch": mem.get("first_oom_batch"), "plot": plot,
            "rows_reason": None if rows else "no per-batch measurements recorded"}


def _readiness(report, stages):
    rd = report.get("readiness")
    if not isinstance(rd, dict):
        return _missing(stages.reason("readiness"))
    if not rd.get("available"):
        return {"ok": True, "available": False, "install": _str(rd.get("install"))}
    rows = []
    for r in _dl(rd.get("rows")):
        lo, hi = r.get("largest_batch"), r.get("smallest_not_fitting")
        cap = r.get("largest_batch_searched_up_to")
        largest = None if lo is None and hi is None else (
            "none" if lo is None else
            (f">= {lo}" if hi is None and isinstance(cap, int) and isinstance(lo, int)
             and lo >= cap // (r.get("chips") or 1) * (r.get("chips") or 1) else
             str(lo) if hi is None or hi - lo <= (r.get("chips") or 1) else f"{lo} (<{hi})"))
        flops, nbytes = _finite(r.get("step_flops")), _finite(r.get("step_bytes_accessed"))
        rows.append({"topology": _str(r.get("topology")), "chips": r.get("chips"), "batch_size": r.get("batch_size"),
                     "error": _str(r.get("error")) or None, "fits": r.get("fits"),
                     "peak": _finite(r.get("step_peak_bytes")), "memory": _finite(r.get("memory_per_chip")),
                     "margin": _finite(r.get("margin_bytes")), "flops": flops,
                     "intensity": flops / nbytes if flops is not None and nbytes else None,
                     "estimate": _finite(r.get("step_estimate_seconds")),
                     "items_per_s": _finite(r.get("items_per_s_estimate")), "largest": largest,
                     "programs": len(_dl(r.get("programs")))})
    return {"ok": True, "available": True, "rows": rows, "note": _str(rd.get("estimate")),
            "libtpu": _str(rd.get("libtpu")), "rows_reason": None if rows else "no topology compiled"}


ASSUMPTION_LABELS = {
    "baseline_price_per_device_hour": "baseline price per device-hour",
    "target_price_per_device_hour": "target price per device-hour",
    "baseline_devices": "baseline devices", "target_devices": "target devices",
    "idle_share": "idle share", "retry_rate": "retry rate", "batch_size": "batch size",
    "items": "items", "currency": "currency",
}


def _cost(report, stages):
    cost = report.get("cost")
    if not isinstance(cost, dict):
        return _missing(stages.reason("cost"))
    a = _d(cost.get("assumptions"))
    currency = _str(a.get("currency"))
    assumptions = []
    for k, v in a.items():
        if k in ("idle_share", "retry_rate"):
            shown = fmt_pct(v, 1)
        elif k.endswith("price_per_device_hour"):
            shown = fmt_money(v, currency) if v is not None else "not set"
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            shown = fmt_num(v)
        else:
            shown = fmt_value(v)
        assumptions.append((ASSUMPTION_LABELS.get(k, k.replace("_", " ")), shown))
    rows = [{"side": _str(r.get("side")), "frontend": _str(r.get("frontend")), "items_per_s": r.get("items_per_s"),
             "startup_seconds": r.get("startup_seconds"), "seconds_per_1000": r.get("seconds_per_1000"),
             "cost_per_1000": r.get("cost_per_1000")} for r in _dl(cost.get("rows"))]
    note = _str(cost.get("note")) or None
    no_prices = (a.get("baseline_price_per_device_hour") is None and a.get("target_price_per_device_hour") is None)
    if not note and rows and (no_prices or all(r["cost_per_1000"] is None for r in rows)):
        note = "no prices configured: costs are device-seconds only"
    return {"ok": True, "assumptions": assumptions, "rows": rows, "note": note, "currency": currency,
            "has_money": any(r["cost_per_1000"] is not None for r in rows),
            "rows_reason": None if rows else "no cost rows recorded"}


def _environment(report, stages):
    tool = _d(report.get("tool"))
    plugin, host = _d(tool.get("plugin")), _d(tool.get("host"))
    facts = [("torch_pjrt", tool.get("torch_pjrt")), ("torch", tool.get("torch")), ("python", tool.get("python"))]
    facts += [(f"plugin {k.replace('_', ' ')}", v) for k, v in plugin.items()]
    for k, v in host.items():
        if k == "memory_bytes":
            facts.append(("host memory", fmt_bytes(v)))
        else:
            facts.append((f"host {k.replace('_', ' ')}", v))
    facts = [(k, fmt_value(v)) for k, v in facts if v is not None]
    w = _d(report.get("workload"))
    workload = [(k.replace("_", " "), fmt_int(v) if k == "parameters" else fmt_value(v))
                for k, v in w.items() if v is not None]
    config, defaults = report.get("config"), report.get("config_defaults")
    config_rows = []
    if isinstance(config, dict):
        d = _d(defaults)
        for k in list(config) + [k for k in d if k not in config]:
            has_v, has_d = k in config, k in d
            config_rows.append({
                "key": _str(k), "value": fmt_value(config[k]) if has_v else "(not recorded)",
                "default": fmt_value(d[k]) if has_d else DASH,
                "changed": has_v and has_d and config[k] != d[k]})
    stage_rows = [{"name": _str(s.get("name")), "status": _str(s.get("status")) or "unknown",
                   "seconds": s.get("seconds"), "reason": _str(s.get("reason"))} for s in _dl(report.get("stages"))]
    return {"ok": True, "tool": facts, "workload": workload, "config": config_rows,
            "config_reason": None if isinstance(config, dict) else "no settings recorded in the report",
            "stages": stage_rows,
            "stages_reason": None if stage_rows else "the report has no stage list",
            "created": _str(report.get("created")), "schema_version": report.get("schema_version")}


def _tiles(ctx):
    """The few headline figures shown under the verdict."""
    t = []
    f = ctx["failures"]
    if f.get("ok"):
        t.append(("failures", fmt_int(f["count"]),
                  (", ".join(f"{len(g['entries'])} {g['label'].lower()}" for g in f["groups"][:3])
                   + (f", {len(f['groups']) - 3} more kinds" if len(f["groups"]) > 3 else "")) or "none recorded",
                  "bad" if f["count"] else "good"))
    c = ctx["coverage"]
    if c.get("ok"):
        by = {x["class"]: x for x in c["classes"]}
        bad = sum(_finite(by.get(k, {}).get("ops")) or 0 for k in ("failing", "cpu_fallback"))
        t.append(("ops needing work", fmt_int(bad),
                  f"of {fmt_int(c['distinct_ops'])} ops; CPU share {fmt_pct(c['fallback_time_share'], 1)}",
                  "bad" if (_finite(by.get("failing", {}).get("ops")) or 0) else "warn" if bad else "good"))
    n = ctx["numerics"]
    if n.get("ok"):
        fails = sum(1 for o in n["outputs"] if o["pass"] is False)
        t.append(("numerics", fmt_pass(n["pass"]), f"{fails} of {len(n['outputs'])} outputs out of tolerance",
                  {"pass": "good", "fail": "bad"}.get(pass_class(n["pass"]), "neutral")))
    m = ctx["memory"]
    if m.get("ok"):
        oom = m["first_oom_batch"]
        t.append(("largest batch", fmt_int(m["largest_batch"]),
                  (f"first OOM at batch {fmt_int(oom)}" if oom is not None else "no OOM seen")
                  + (f"; limit {fmt_bytes(m['limit'])}" if m["limit"] is not None else ""),
                  "neutral" if m["largest_batch"] is None else "warn" if oom is not None else "good"))
    i = ctx["inventory"]
    if i.get("ok"):
        s = dict(i["summary"])
        t.append(("code changes", fmt_int(len(i["entries"])),
                  ", ".join(f"{fmt_int(s.get(e))} {e}" for e in reversed(EFFORTS)),
                  "warn" if _finite(s.get("rewrite")) else "good" if not i["entries"] else "neutral"))
    return t


def _target(report):
    plugin = _d(_d(report.get("tool")).get("plugin"))
    kind = _str(plugin.get("device_kind")) or _str(plugin.get("platform")) or _str(plugin.get("name"))
    n = _finite(plugin.get("devices"))
    return kind + (f" \u00d7 {int(n)}" if kind and n and n > 1 else "")


def context(report):
    """Everything the templates show, normalised: never raises on a partial report."""
    if not isinstance(report, dict):
        report = {}
    stages = _Stages(report)
    w = _d(report.get("workload"))
    ctx = {"sections": SECTIONS, "schema_version": report.get("schema_version"),
           "schema_mismatch": report.get("schema_version") not in (SCHEMA_VERSION, None),
           "expected_schema": SCHEMA_VERSION,
           "workload": {"name": _str(w.get("name")) or "unnamed workload", "source": _str(w.get("source")),
                        "mode": _str(w.get("mode")), "precision": _str(w.get("precision")),
                        "batch_sizes": ", ".join(_str(b) for b in w.get("batch_sizes") or [])
                        if isinstance(w.get("batch_sizes"), list) else _str(w.get("batch_sizes")),
                        "baseline_device": _str(w.get("baseline_device")), "parameters": w.get("parameters")},
           "target": _target(report),
           "created": _str(report.get("created"))}
    for key, fn in (("verdict", _verdict), ("failures", _failures), ("inventory", _inventory),
                    ("coverage", _coverage), ("numerics", _numerics), ("performance", _performance),
                    ("memory", _memory), ("readiness", _readiness), ("cost", _cost),
                    ("environment", _environment)):
        ctx[key] = _guard(fn, report, stages)
    if "overall" not in ctx["verdict"]:
        ctx["verdict"].update(overall=None, css="unknown", criteria=[], blocking=[], changes=[], not_measured=[])
    ctx["failures"].setdefault("groups", [])
    ctx["failures"].setdefault("count", 0)
    try:
        ctx["tiles"] = _tiles(ctx)
    except Exception:
        ctx["tiles"] = []
    return ctx


# ------------------------------------------------------------------------ output

def md_cell(x):
    """Markdown prose in a table cell or list item: one line; pipes, tag-like '<', entity-like '&'
    and emphasis markers escaped (the rest left readable as plain text)."""
    s = x if isinstance(x, str) else _str(x)
    s = re.sub(r"\s*[\r\n]+\s*", " ", s).strip()
    s = s.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*").replace("`", "\\`")
    s = re.sub(r"&(?=#?\w+;)", "&amp;", s)
    s = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", s)
    s = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", s)
    s = re.sub(r"^([#>+-]|\d+[.)])(?=\s|$)", r"\\\1", s)
    return s or DASH


def md_icode(x):
    """Code-like text (paths, ops, settings) as inline code in a table cell."""
    s = x if isinstance(x, str) else _str(x)
    s = re.sub(r"\s*[\r\n]+\s*", " ", s).strip()
    if not s:
        return DASH
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{ticks}{pad}{s.replace('|', chr(92) + '|')}{pad}{ticks}"


def md_code(x):
    """A fenced code block that nothing in x can close."""
    s = _str(x)
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{s}\n{fence}"


@functools.lru_cache(maxsize=None)
def _env(autoescape):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR), autoescape=autoescape,
                             undefined=jinja2.ChainableUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters.update(num=fmt_num, int=fmt_int, sci=fmt_sci, cos=fmt_cos, pct=fmt_pct, secs=fmt_secs,
                       bytes=fmt_bytes, money=fmt_money, value=fmt_value, passfail=fmt_pass, passcls=pass_class,
                       cell=md_cell, icode=md_icode, code=md_code)
    return env


def _fallback_html(report, err):
    from markupsafe import escape
    body = escape(json.dumps(report, indent=1, default=str)[:200000])
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Migration assessment</title></head><body>"
            f"<h1>Migration assessment</h1><p>The report could not be rendered ({escape(err)}); "
            f"report.json follows.</p><pre>{body}</pre></body></html>")


def render(report, out_dir):
    """Writes out_dir/report.md and out_dir/report.html from a report.json dict; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"md": os.path.join(out_dir, "report.md"), "html": os.path.join(out_dir, "report.html")}
    # one context for both, so the plots are drawn once
    try:
        ctx = context(report)
        html = _env(True).get_template("report.html.j2").render(**ctx)
    except Exception as e:
        ctx, html = None, _fallback_html(report, f"{type(e).__name__}: {e}")
    try:
        md = _env(False).get_template("report.md.j2").render(**(ctx or context(report)))
    except Exception as e:
        md = f"# Migration assessment\n\nThe report could not be rendered ({type(e).__name__}: {e}); see report.json.\n"
    for key, text in (("md", md), ("html", html)):
        tmp = paths[key] + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, paths[key])
    return paths


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m torch_pjrt.assess.report",
                                description="Render report.md and report.html from an assessment's report.json.")
    p.add_argument("report", help="path to report.json")
    p.add_argument("--out", help="output directory (default: the directory of report.json)")
    a = p.parse_args(argv)
    try:
        with open(a.report, encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        print(f"error: cannot read {a.report}: {e}", file=sys.stderr)
        return 2
    out = a.out or os.path.dirname(os.path.abspath(a.report))
    for path in render(report, out).values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
