"""The assessment's report rendering (torch_pjrt/assess/report.py): report.md and report.html
from a report.json dict. Needs no device: the module is loaded from its file.

The sample (tests/fixtures/assess_report_sample.json) has every section filled, failures of
five kinds and a 'not ready' verdict; the variants take sections away, null them, break
their types, or carry error texts full of HTML. A headless Chromium opens the sample's page
(skipped where chromium is not installed; scripts/setup.sh installs it as root on Debian).
"""
import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "tests", "fixtures", "assess_report_sample.json")
SECTIONS = ["inventory", "coverage", "numerics", "performance", "memory", "cost", "verdict"]
TOP_KEYS = ["tool", "workload", "config", "config_defaults", "stages", "failures"] + SECTIONS
HEADINGS = ["## Verdict & criteria", "## Failures", "## Inventory", "## Op coverage", "## Numerics",
            "## Performance", "## Memory", "## Cost", "## Environment & settings"]
SECTION_IDS = ["verdict", "failures", "inventory", "coverage", "numerics", "performance", "memory",
               "cost", "environment"]
PLOTS = ["hist", "loss", "cold", "latency", "throughput", "memory"]


@pytest.fixture(scope="module")
def report_mod():
    spec = importlib.util.spec_from_file_location(
        "assess_report_under_test", os.path.join(ROOT, "torch_pjrt", "assess", "report.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sample():
    with open(SAMPLE, encoding="utf-8") as f:
        return json.load(f)


def _render(mod, report, out):
    paths = mod.render(report, str(out))
    assert set(paths) == {"md", "html"}
    assert paths["md"] == os.path.join(str(out), "report.md")
    assert paths["html"] == os.path.join(str(out), "report.html")
    with open(paths["md"], encoding="utf-8") as f:
        md = f.read()
    with open(paths["html"], encoding="utf-8") as f:
        html = f.read()
    return md, html


def _check_structure(md, html):
    """Both documents whole: every heading and section, nothing external, no scripts."""
    for h in HEADINGS:
        assert re.search(rf"^{re.escape(h)}$", md, re.M), f"missing {h!r} in report.md"
    assert "could not be rendered" not in md and "could not be rendered" not in html
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    positions = [html.find(f'<section id="{s}">') for s in SECTION_IDS]
    assert all(p >= 0 for p in positions), dict(zip(SECTION_IDS, positions))
    assert positions == sorted(positions), "sections out of order"
    # one self-contained file: in every tag, each src/href is a fragment or inline data (text
    # such as an escaped error "&lt;img src=https://..." is no tag); no scripts, no links
    tags = re.findall(r"<[A-Za-z][^>]*>", html)
    refs = [v for t in tags for v in re.findall(r"""\s(?:src|href|xlink:href)\s*=\s*["']?([^"'\s>]*)""", t)]
    assert all(r.startswith(("#", "data:")) for r in refs), [r for r in refs if not r.startswith(("#", "data:"))]
    assert not any(re.search(r"""\s(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", t) for t in tags)
    assert not re.search(r"<script\b", html, re.I)
    assert not re.search(r"<link\b|@import|url\(\s*['\"]?(?:https?:)?//", html, re.I)
    assert not re.search(r"<(?:iframe|object|embed)\b", html, re.I)


def _figures(html):
    """data-plot name -> the <figure> markup."""
    return dict(re.findall(r'<figure class="plot" data-plot="([a-z]+)">(.*?)</figure>', html, re.S))


@pytest.fixture(scope="module")
def sample_rendered(report_mod, sample, tmp_path_factory):
    """The sample rendered once: (out_dir, md, html)."""
    out = tmp_path_factory.mktemp("sample")
    md, html = _render(report_mod, sample, out)
    return out, md, html


def test_sample_renders_every_section(sample, sample_rendered):
    _, md, html = sample_rendered
    _check_structure(md, html)
    assert "not run:" not in md and 'class="notrun"' not in html
    # the verdict first, prominent, with its blocking items and changes
    assert '<div class="verdict not-ready" id="verdict-summary">' in html
    assert '<div class="value" id="verdict-overall">not ready</div>' in html
    assert html.find("verdict-summary") < html.find('<section id="verdict">')
    for item in sample["verdict"]["blocking"] + sample["verdict"]["changes"]:
        assert f"<li>{item.replace('>', '&gt;')}</li>" in html
    assert "**Verdict: NOT READY**" in md
    # every plot drawn as inline SVG, each with its own ids
    figs = _figures(html)
    assert set(figs) == set(PLOTS)
    for name, fig in figs.items():
        assert "<svg" in fig and "plot unavailable" not in fig, name
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "duplicate element ids"
    # failures grouped by kind, in the schema's order, each with stage, batch, op, error, next step
    kinds = re.findall(r'<h3 id="failures-([a-z_]+)">', html)
    assert kinds == ["out_of_memory", "unsupported_op", "compile_error", "numerics_mismatch", "timeout"]
    assert html.count('<div class="failure">') == len(sample["failures"])
    assert "&lt;called from gptlib/model.py:61&gt;" in html  # escaped error text
    assert "(s0 &lt;= 4096) &amp; cannot be bounded" in html
    for f in sample["failures"]:
        assert f["next_step"].split("(")[0].strip() in md
    # tables carry the numbers
    assert "gptlib/ops/fused_adam.cu:1" in html and "`gptlib/ops/fused_adam.cu:1`" in md
    assert "12.68 %" in html  # CPU-fallback share of op time
    assert "gptlib/model.py:88 in forward" in html  # graph-break source line
    assert "input 0 shape (1, 128) -&gt; (2, 128)" in html  # recompile
    assert "4.13e-02" in md and "0.99971" in md  # numerics per output
    assert "| loss after 10 steps | 5.9132 | 5.9171 | 0.01 | pass |" in md
    assert "41.2 s" in md and "9.3 s" in md  # cold start totals
    assert re.search(r"\| compiled \| 8 \| [\d.]+ ms \| [\d.]+ ms \| [\d.]+ ms \| 30 \| 644 \|", md)
    assert "| 16 | — | — | **out_of_memory** |" in md
    assert "first out-of-memory batch: **16**" in md
    assert "0.000654" in md and "- target price per device-hour: 1.20 USD" in md
    assert "| `warmup` | **`3`** | `5` |" in md  # setting with its default, changed
    assert "| memory | ok | 27.5 s | batch 16 ran out of memory (limit 2 GiB) |" in md


def _variants(sample):
    """(name, report, text that must appear in report.md)."""
    out = []
    for key in TOP_KEYS:
        r = copy.deepcopy(sample)
        del r[key]
        out.append((f"no-{key}", r, None))
        r = copy.deepcopy(sample)
        r[key] = None
        out.append((f"null-{key}", r, None))
    r = copy.deepcopy(sample)
    for key in TOP_KEYS:
        r[key] = None
    out.append(("all-null", r, "not run: the report has no stage list"))
    out.append(("empty", {}, "not run: the report has no stage list"))
    for bad in (None, [], "report", 3):
        out.append((f"not-a-dict-{type(bad).__name__}", bad, "**Verdict: NO VERDICT**"))

    # a failed stage: its section says why, from stages[].reason
    r = copy.deepcopy(sample)
    r["numerics"] = None
    for s in r["stages"]:
        if s["name"] == "numerics":
            s.update(status="failed", reason="baseline run crashed: CUDA error | <out of memory> & more")
    out.append(("numerics-failed", r, "not run: the numerics stage failed: baseline run crashed: "
                                      "CUDA error \\| &lt;out of memory> & more"))
    r = copy.deepcopy(sample)
    r["performance"] = None
    for s in r["stages"]:
        if s["name"] == "performance":
            s.update(status="skipped", reason="--skip performance")
    out.append(("performance-skipped", r, "not run: the performance stage was skipped: --skip performance"))
    r = copy.deepcopy(sample)
    r["memory"] = None
    r["stages"] = [s for s in r["stages"] if s["name"] != "memory"]
    out.append(("memory-no-stage", r, "not run: no 'memory' stage in the report"))

    # every section present but empty
    r = copy.deepcopy(sample)
    r["failures"] = []
    r["inventory"] = {"files_scanned": 3, "packages_scanned": [], "items": [], "summary": {}}
    r["coverage"] = {"ops": [], "summary": {}, "fallback_time_share": None, "graph_breaks": [], "graphs": 0,
                     "recompiles": []}
    r["numerics"] = {"baseline_device": "cpu", "frontends": [], "outputs": [], "task_metric": None,
                     "loss_curve": None, "pass": None}
    r["performance"] = {"cold_start": [], "latency": [], "throughput": []}
    r["memory"] = {"per_batch": [], "limit_bytes": None, "largest_batch": None, "first_oom_batch": None}
    r["cost"] = {"assumptions": {}, "rows": [], "note": None}
    r["verdict"] = {"overall": "ready", "criteria": [], "blocking": [], "changes": []}
    out.append(("all-empty", r, "No failures recorded."))

    # ready: nothing blocks
    r = copy.deepcopy(sample)
    r["failures"] = []
    r["verdict"].update(overall="ready", blocking=[], changes=[])
    for c in r["verdict"]["criteria"]:
        c["pass"] = True
    out.append(("ready", r, "**Blocking:** nothing blocks the move"))
    r = copy.deepcopy(sample)
    r["verdict"].update(overall="ready after listed changes", blocking=[])
    out.append(("ready-after-changes", r, "**Verdict: READY AFTER LISTED CHANGES**"))

    # no prices: device-seconds only
    r = copy.deepcopy(sample)
    r["cost"]["assumptions"].update(baseline_price_per_device_hour=None, target_price_per_device_hour=None)
    for row in r["cost"]["rows"]:
        row["cost_per_1000"] = None
    out.append(("no-prices", r, "costs are device-seconds only"))

    # inference, no task metric, percentiles without samples
    r = copy.deepcopy(sample)
    r["workload"].update(mode="inference", task_metric=None)
    r["numerics"].update(loss_curve=None, task_metric=None)
    for row in r["performance"]["latency"]:
        row["samples"] = []
    out.append(("inference", r, "inference workload: no loss curve"))

    # wrong types everywhere a stage could have gone wrong
    r = copy.deepcopy(sample)
    r["inventory"]["items"] = [None, 3, {"file": None, "line": "x"}, {"effort": ["odd"]}]
    r["inventory"]["summary"] = "n/a"
    r["coverage"]["ops"] = [{"op": None, "count": "many", "class": 7}, "aten::mm"]
    r["coverage"]["graph_breaks"] = [{"reason": None, "user_frames": "model.py:1"}]
    r["numerics"]["outputs"][0]["abs_error_histogram"] = {"edges_log10": [float("-inf"), -3, -2], "counts": [5]}
    r["numerics"]["outputs"][1]["abs_error_histogram"] = {"edges_log10": "bad", "counts": None}
    r["numerics"]["outputs"][2]["shape"] = "4x4"
    r["numerics"]["outputs"][3]["max_abs"] = "big"
    r["numerics"]["loss_curve"] = {"baseline": [1.0, None], "eager": "nope", "compiled": [1.0, 0.9]}
    r["performance"]["latency"][0]["samples"] = [None, "x", 0.001, float("nan")]
    r["performance"]["latency"].append({"frontend": None, "batch_size": None})
    r["performance"]["cold_start"].append({"frontend": "eager", "cache": "hot", "total": "slow"})
    r["performance"]["throughput"].append({"frontend": "eager", "batch_size": "big", "items_per_s": -1})
    r["memory"]["per_batch"].append({"batch_size": None, "peak_bytes": "lots", "status": None})
    r["memory"]["limit_bytes"] = 0
    r["cost"]["assumptions"] = [1, 2]
    r["cost"]["rows"].append({"side": None})
    r["verdict"]["criteria"].append("not a dict")
    r["verdict"]["blocking"] = "one string, not a list"
    r["config"]["nested"] = {"a": [1, {"b": None}]}
    r["stages"].append({"name": None, "status": None, "seconds": "long"})
    r["failures"].append({"kind": None, "error": None})
    r["failures"].append({"kind": "segfault", "stage": "performance", "error": 12345})
    r["schema_version"] = 2
    out.append(("wrong-types", r, "this renderer reads version 1"))

    # huge error text full of HTML metacharacters and Markdown fences
    r = copy.deepcopy(sample)
    evil = "<script>alert('x')</script> & <img src=http://example.com/x.png onerror=alert(1)> ``` | "
    r["failures"][0]["error"] = "\n".join(f"line {i}: {evil}" for i in range(5000))
    r["failures"][1]["error"] = evil * 2000  # one very long line
    r["failures"][2]["next_step"] = "<b>bold?</b> & <a href='https://example.com'>link</a>"
    r["verdict"]["blocking"].append("<script>alert(2)</script>")
    r["inventory"]["items"][0]["detail"] = "`torch.cuda` | <cuda> ```"
    r["workload"]["name"] = "<img src=https://example.com/a.png>"
    label = "--><script>alert(3)</script><!-- & </svg>"  # into the plots' legends and labels
    r["numerics"]["outputs"][0]["name"] = label
    r["performance"]["cold_start"][0]["frontend"] = label
    r["performance"]["latency"][0]["frontend"] = label
    r["numerics"]["loss_curve"][label] = [1.0, 2.0]
    out.append(("evil-errors", r, "more lines not shown"))
    return out


with open(SAMPLE, encoding="utf-8") as _f:
    VARIANTS = {name: (report, expect) for name, report, expect in _variants(json.load(_f))}
# variants whose plot data differ from the sample's draw their plots; the rest (a section taken
# away) get a stub, which keeps the test fast (each full render draws six plots, about 1 s)
PLOTTED = {"all-empty", "inference", "wrong-types", "evil-errors"}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_renders_without_raising(report_mod, tmp_path, monkeypatch, name):
    report, expect = VARIANTS[name]
    if name not in PLOTTED:
        monkeypatch.setattr(report_mod, "_plot", lambda key, label, fn, *a: {
            "key": key, "label": label, "svg": report_mod.Markup('<svg class="plot"></svg>')})
    md, html = _render(report_mod, report, tmp_path)
    _check_structure(md, html)
    if expect is not None:
        assert expect in md, (name, expect)
    if name.startswith(("no-", "null-")):
        key = name.split("-", 1)[1]
        if key in SECTIONS:
            assert re.search(r"not run: [^\n]+", md), name
            assert '<p class="notrun">not run: ' in html, name
    if name == "evil-errors":
        assert "<script" not in html and "<img" not in html and "<b>bold" not in html
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &lt;img src=http://example.com" in html
        assert "more characters not shown" in html
        figs = _figures(html)
        assert set(figs) == set(PLOTS) and all(f.count("<svg") == f.count("</svg>") == 1 for f in figs.values())
        assert len(html) < 1_000_000, "error text not trimmed"
        # the error's ``` cannot close the Markdown code fence around it
        assert "\n  ````text\n" in md
        assert "&lt;b>bold?&lt;/b> & &lt;a href='https://example.com'>link&lt;/a>" in md
    if name == "ready":
        assert '<div class="verdict ready" id="verdict-summary">' in html
    if name == "all-empty":
        assert "No CUDA-specific code found." in md and "No graph breaks." in md
        assert "<svg" not in html  # nothing to plot, and no empty plots either
    if name == "wrong-types":
        assert "out of memory" in html and "Segfault (1)" in md


def test_plot_failure_is_contained(report_mod, sample, tmp_path, monkeypatch):
    def boom(*a):
        raise RuntimeError("no <canvas> today")
    monkeypatch.setattr(report_mod, "_plot_latency", boom)
    md, html = _render(report_mod, sample, tmp_path)
    _check_structure(md, html)
    assert "plot unavailable: RuntimeError: no &lt;canvas&gt; today" in _figures(html)["latency"]


def test_cli_rerenders_from_json(report_mod, sample, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(report_mod, "_plot", lambda key, label, fn, *a: None)  # plots: tested above
    src = tmp_path / "old" / "report.json"
    src.parent.mkdir()
    src.write_text(json.dumps(sample))
    assert report_mod.main([str(src), "--out", str(tmp_path / "new")]) == 0
    assert (tmp_path / "new" / "report.md").exists() and (tmp_path / "new" / "report.html").exists()
    assert str(tmp_path / "new" / "report.html") in capsys.readouterr().out
    assert report_mod.main([str(src)]) == 0  # default: next to the JSON
    assert (src.parent / "report.html").exists()
    assert report_mod.main([str(tmp_path / "missing.json")]) == 2


def _chromium():
    for name in (os.environ.get("TORCH_PJRT_CHROMIUM"), "chromium", "chromium-browser", "google-chrome",
                 "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def test_chromium_renders_the_page(sample_rendered, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium not installed (scripts/setup.sh installs Debian's chromium when run as root)")
    np = pytest.importorskip("numpy")
    mpimg = pytest.importorskip("matplotlib.image")
    out, _, _ = sample_rendered
    shot = tmp_path / "shot.png"
    # one browser run: screenshot and DOM; no network (every host unresolvable), its own profile
    r = subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}",
         "--host-resolver-rules=MAP * ~NOTFOUND", f"--screenshot={shot}", "--dump-dom",
         "--window-size=1280,4000", "file://" + str(out / "report.html")],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    dom = r.stdout
    # the page as the browser built it: verdict, every section, every plot as SVG
    assert re.search(r'id="verdict-overall">\s*not ready\s*<', dom)
    for s in SECTION_IDS:
        assert f'<section id="{s}">' in dom
    figs = _figures(dom)
    assert set(figs) == set(PLOTS)
    for name, fig in figs.items():
        assert "<svg" in fig and "<path" in fig, name
    # no console messages (the page has no script; nothing failed to load)
    console = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln
               or "ERR_NAME_NOT_RESOLVED" in ln or "Failed to load" in ln]
    assert not console, console
    # the screenshot: a real page, not a blank one, with the verdict's red banner at the top
    assert shot.exists() and shot.stat().st_size > 50_000
    img = mpimg.imread(str(shot))[..., :3]
    assert img.shape[:2] == (4000, 1280)
    non_white = (img < 0.95).any(axis=2)
    assert non_white.mean() > 0.05
    assert len(np.unique((img[::7, ::7] * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 100
    top = img[:700]
    red = (np.abs(top - np.array([0xcf, 0x22, 0x2e]) / 255).max(axis=2) < 0.06).sum()
    assert red > 20_000, f"verdict banner not seen ({red} red pixels)"
