"""The migration assessment end to end (python -m torch_pjrt assess): the
shipped GPT and CNN in --quick mode, and workloads made to fail in each class
(tests/fixtures/assess_workloads.py): an op with no lowering, out of memory
under a memory limit, a numerics mismatch, a stage whose process crashes.
Each run is a real assessment (its stages in their own processes)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "assess_workloads.py")
KEYS = ("inventory", "coverage", "numerics", "performance", "memory", "failures", "cost", "verdict")


def assess(tmp_path, spec, *args, config=None, expect_rc=0, env_extra=None):
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "torch_pjrt", "assess", *([spec] if spec else []), "--out", str(out),
           "--no-progress", *args]
    if config:
        cfg = tmp_path / "config.toml"
        cfg.write_text(config)
        cmd += ["--config", str(cfg)]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", **(env_extra or {}))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500, cwd=ROOT)
    if expect_rc is not None:  # (None: any code, the caller looks)
        assert p.returncode == expect_rc, p.stdout[-2000:] + p.stderr[-4000:]
    if expect_rc is None or expect_rc or "--baseline-only" in args:
        return p
    with open(out / "report.json") as f:
        return json.load(f), p, out


def stage(report, name):
    return next(s for s in report["stages"] if s["name"] == name)


def kinds(report):
    return {f["kind"] for f in report["failures"]}


def test_gpt_training_quick_end_to_end(tmp_path):
    r, p, out = assess(tmp_path, "examples/workloads.py:gpt", "--quick")
    assert r["schema_version"] == 1 and all(k in r for k in KEYS)
    assert {s["name"]: s["status"] for s in r["stages"]} == {
        "inventory": "ok", "coverage": "ok", "numerics": "ok", "performance": "ok", "memory": "ok",
        "readiness": "ok", "cost": "ok", "verdict": "ok"}, r["stages"]
    assert r["failures"] == [], r["failures"]
    cov = r["coverage"]
    assert cov["summary"]["failing"] == 0 and cov["summary"]["cpu_fallback"] == 0
    assert any(o["op"] == "aten::_scaled_dot_product_fused_attention_overrideable" for o in cov["ops"])
    assert cov["recompiles"], "the batch sweep recompiles the compiled step"
    num = r["numerics"]
    assert num["pass"] and {o["frontend"] for o in num["outputs"]} == {"eager", "compiled"}
    curves = num["loss_curve"]
    assert len(curves["baseline"]) == len(curves["eager"]) == 10 and curves["eager"][-1] < curves["eager"][0]
    perf = r["performance"]
    states = {(c["frontend"], c["cache"]) for c in perf["cold_start"]}
    assert states == {("baseline", "cold"), ("eager", "cold"), ("eager", "warm"), ("compiled", "cold"),
                      ("compiled", "warm")}
    for c in perf["cold_start"]:
        assert all(c[k] >= 0 for k in ("process_start", "import", "model_load", "first_call", "steady_call"))
    warm = {c["frontend"]: c["first_call"] for c in perf["cold_start"] if c["cache"] == "warm"}
    cold = {c["frontend"]: c["first_call"] for c in perf["cold_start"] if c["cache"] == "cold"}
    assert warm["eager"] < cold["eager"]  # the persistent cache
    sizes = {(l["frontend"], l["batch_size"]) for l in perf["latency"]}
    assert sizes == {(f, b) for f in ("baseline", "eager", "compiled") for b in (1, 2, 4, 8)}
    for l in perf["latency"]:
        assert l["p50"] <= l["p95"] <= l["p99"] and l["n"] == len(l["samples"]) == 5
    assert r["memory"]["largest_batch"] >= 8 and r["memory"]["first_oom_batch"] is None
    assert r["cost"]["rows"] and r["cost"]["note"]  # no prices: device-seconds only
    rd = r["readiness"]  # --quick: v5e:2x2, one chip, no largest-batch search
    assert rd["available"] and [(x["topology"], x["batch_size"]) for x in rd["rows"]] == [
        ("v5e:2x2", b) for b in (1, 2, 4, 8)]
    assert all(x["fits"] and x["step_flops"] > 0 and x["step_estimate_seconds"] > 0 for x in rd["rows"])
    assert {p["phase"] for p in rd["rows"][0]["programs"]} >= {"forward", "backward", "optimizer step"}
    assert r["verdict"]["overall"] in ("ready", "ready after listed changes")
    assert (out / "report.html").exists() and (out / "report.md").exists()
    md = (out / "report.md").read_text()
    assert "## TPU readiness (estimate)" in md and "| v5e:2x2 | 1 | 8 | yes |" in md
    assert "verdict:" in p.stdout and "report.html" in p.stdout


def test_cnn_inference_quick_with_prices_and_thresholds(tmp_path):
    r, _, _ = assess(tmp_path, "examples/workloads.py:cnn", "--quick", config="""
[run]
stages = ["coverage", "numerics", "performance", "cost", "verdict"]
frontends = ["eager"]
[prices]
baseline_per_device_hour = 2.0
target_per_device_hour = 1.0
[thresholds]
latency_p95_ms = 100000
min_throughput_ratio = 0.000001
""")
    assert r["numerics"]["pass"]
    metric = r["numerics"]["task_metric"]
    assert metric["name"] == "top-1 agreement" and metric["pass"]
    assert all(row["cost_per_1000"] is not None and row["cost_per_1000"] > 0 for row in r["cost"]["rows"])
    crit = {c["name"]: c["pass"] for c in r["verdict"]["criteria"]}
    assert crit["latency"] is True and crit["throughput"] is True and crit["numerics"] is True
    assert stage(r, "memory")["status"] == "skipped"
    assert r["config"]["prices"]["target_per_device_hour"] == 1.0
    assert r["config_defaults"]["prices"]["target_per_device_hour"] is None


def test_readiness_stage_topologies_chips_and_largest_batch(tmp_path):
    # batch x 1 MiB of output: a v5e chip (15.75 GiB) holds some thousands.
    r, _, out = assess(tmp_path, f"{FIXTURES}:wide_output", config="""
[run]
stages = ["readiness"]
batch_sizes = [4, 64]
[readiness]
topologies = ["v5e:2x2", "v6e:2x2"]
chips = [1, 2]
largest_batch = true
max_batch = 65536
tolerance = 0.05
""")
    rows = r["readiness"]["rows"]
    assert {(x["topology"], x["chips"], x["batch_size"]) for x in rows} == {
        (t, c, b) for t in ("v5e:2x2", "v6e:2x2") for c in (1, 2) for b in (4, 64)}
    last = [x for x in rows if x["batch_size"] == 64]
    assert all(4096 < x["largest_batch"] < 65536 and x["largest_batch"] % x["chips"] == 0 for x in last)
    by = {(x["topology"], x["chips"]): x["largest_batch"] for x in last}
    assert by[("v6e:2x2", 1)] > by[("v5e:2x2", 1)] and by[("v5e:2x2", 2)] > by[("v5e:2x2", 1)]
    assert all(x.get("largest_batch") is None for x in rows if x["batch_size"] == 4)
    html = (out / "report.html").read_text()
    assert 'id="readiness"' in html and "estimate" in html


def test_readiness_without_libtpu_says_how_to_install(tmp_path):
    r, _, out = assess(tmp_path, "examples/workloads.py:cnn", config="""
[run]
stages = ["readiness", "verdict"]
""", env_extra={"TORCH_PJRT_LIBTPU": str(tmp_path / "absent" / "libtpu.so")})
    assert r["readiness"]["available"] is False
    assert "pip install libtpu==" in r["readiness"]["install"]
    assert stage(r, "readiness")["status"] == "ok"
    assert "pip install libtpu==" in (out / "report.md").read_text()
    assert "pip install libtpu==" in (out / "report.html").read_text()


FAST = """
[run]
stages = [{stages}]
frontends = ["eager"]
warmup = 1
iterations = 3
"""


def test_op_without_lowering_is_a_cpu_fallback_with_its_time_share(tmp_path):
    r, _, _ = assess(tmp_path, f"{FIXTURES}:unlowered", config=FAST.format(stages='"coverage", "verdict"'))
    ops = {o["op"]: o for o in r["coverage"]["ops"]}
    i0 = [o for name, o in ops.items() if "aten::i0" in name]
    assert i0 and i0[0]["class"] == "cpu_fallback" and i0[0]["seconds"] > 0
    assert 0 < r["coverage"]["fallback_time_share"] <= 1
    assert r["coverage"]["summary"]["cpu_fallback"] >= 1
    assert any("i0" in c for c in r["verdict"]["changes"])


def test_out_of_memory_from_some_batch_on_stops_the_sweep(tmp_path):
    r, _, _ = assess(tmp_path, f"{FIXTURES}:wide", config=FAST.format(stages='"memory", "cost", "verdict"') + """
[memory]
limit = "48MiB"
sweep_factor = 1
""")
    mem = r["memory"]
    assert mem["limit_bytes"] == 48 << 20
    statuses = [(row["batch_size"], row["status"]) for row in mem["per_batch"]]
    assert statuses[-1][1] == "out_of_memory" and all(s == "ok" for _, s in statuses[:-1]), statuses
    assert mem["first_oom_batch"] == statuses[-1][0] and mem["largest_batch"] == statuses[-2][0]
    assert mem["first_oom_batch"] < 32  # the sweep stopped there
    oom = [f for f in r["failures"] if f["kind"] == "out_of_memory"]
    assert oom and oom[0]["stage"] == "memory" and oom[0]["batch_size"] == mem["first_oom_batch"]
    assert "smaller batch" in oom[0]["next_step"]
    assert r["verdict"]["overall"] == "not ready"  # batch 32 is required and does not fit
    assert any(b.startswith("memory:") for b in r["verdict"]["blocking"])


def test_perturbed_model_is_a_numerics_mismatch(tmp_path):
    r, _, _ = assess(tmp_path, f"{FIXTURES}:perturbed", config=FAST.format(stages='"numerics", "verdict"'))
    num = r["numerics"]
    assert not num["pass"] and not num["outputs"][0]["pass"]
    assert num["outputs"][0]["max_abs"] == pytest.approx(1e-2, rel=1e-3)
    assert "numerics_mismatch" in kinds(r)
    assert r["verdict"]["overall"] == "not ready"


def test_crashing_stage_keeps_the_other_stages(tmp_path):
    r, _, out = assess(tmp_path, f"{FIXTURES}:crashing",
                       config=FAST.format(stages='"numerics", "performance", "cost", "verdict"'))
    assert stage(r, "numerics")["status"] == "ok" and r["numerics"]["pass"]
    perf = stage(r, "performance")
    assert perf["status"] == "failed" and "runtime_error" in perf["reason"]
    crash = [f for f in r["failures"] if f["stage"] == "performance"]
    assert crash and "signal 11" in crash[0]["error"]
    assert r["verdict"]["overall"] == "not ready"
    assert (out / "report.html").exists()


def test_baseline_captured_elsewhere_and_compared(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    p = assess(base, f"{FIXTURES}:perturbed", "--baseline-only", "--device", "cpu",
               config=FAST.format(stages='"numerics"'))
    assert "baseline captured" in p.stdout
    meta = json.loads((base / "report" / "baseline.json").read_text())
    assert meta["device"] == "cpu" and meta["precision"] == "float32" and meta["performance"]["latency"]
    r, _, _ = assess(tmp_path, f"{FIXTURES}:perturbed", "--against", str(base / "report" / "baseline.json"),
                     config=FAST.format(stages='"numerics", "performance", "verdict"'))
    assert r["workload"]["baseline_device"] == "cpu"
    assert not r["numerics"]["pass"]  # the captured outputs were compared
    assert any(l["frontend"] == "baseline" for l in r["performance"]["latency"])  # the captured timings


def test_unequal_baseline_is_refused(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    assess(base, "examples/workloads.py:cnn", "--baseline-only", "--device", "cpu",
           config=FAST.format(stages='"numerics"'))
    p = assess(tmp_path, "examples/workloads.py:cnn", "--against", str(base / "report" / "baseline.json"),
               config=FAST.format(stages='"numerics"') + "batch_sizes = [2, 3]\n", expect_rc=2)
    assert "refusing to compare" in p.stderr and "batch sizes" in p.stderr


def test_unseeded_inputs_are_the_same_on_both_sides(tmp_path):
    # torch.randn in make_inputs, no seeding factory: the baseline and tpu
    # drew different inputs, and the verdict was a false numerics failure.
    r, _, _ = assess(tmp_path, f"{FIXTURES}:unseeded", config=FAST.format(stages='"numerics", "verdict"'))
    assert r["numerics"]["pass"], r["numerics"]["outputs"]


def test_baseline_capture_errors_and_unusable_baselines(tmp_path):
    # A device the baseline cannot use: the capture's own error, not KeyError.
    p = assess(tmp_path, f"{FIXTURES}:unseeded", "--baseline-only", "--device", "bogus",
               config=FAST.format(stages='"numerics"'), expect_rc=None)
    assert p.returncode != 0 and "KeyError" not in p.stderr and "bogus" in p.stderr, p.stderr
    base = tmp_path / "base"
    base.mkdir()
    assess(base, f"{FIXTURES}:unseeded", "--baseline-only", "--device", "cpu", config=FAST.format(stages='"numerics"'))
    # An inference baseline for a training workload is refused (it was compared).
    p = assess(tmp_path, f"{FIXTURES}:unseeded_training", "--against", str(base / "report" / "baseline.json"),
               config=FAST.format(stages='"numerics"'), expect_rc=2)
    assert "refusing to compare" in p.stderr and "mode inference there, training here" in p.stderr
    for text in ('{"a": 1}', "not json"):
        junk = tmp_path / "junk.json"
        junk.write_text(text)
        p = assess(tmp_path, f"{FIXTURES}:unseeded", "--against", str(junk), config=FAST.format(stages='"numerics"'),
                   expect_rc=2)
        assert "junk.json" in p.stderr and ("not a baseline.json" in p.stderr or "not a readable" in p.stderr)


def test_hf_tiny_llama_generation(tmp_path):
    pytest.importorskip("transformers")
    from torch_pjrt.assess.hf import make_tiny_llama
    model_dir = make_tiny_llama(str(tmp_path / "tiny-llama"))
    r, _, _ = assess(tmp_path, None, "--hf", model_dir, config=FAST.format(stages='"numerics", "verdict"'))
    assert r["workload"]["mode"] == "generation"
    metric = r["numerics"]["task_metric"]
    assert metric["name"].startswith("token agreement") and metric["target"] == 1.0


@pytest.mark.parametrize("spec,message", [
    ("examples/workloads.py:nope", "has no function"),
    ("missing.py:gpt", "no such file"),
    (f"{FIXTURES}:not_a_workload", "expected torch_pjrt.assess.Workload"),
    ("gpt", "expected path/to/file.py:function"),
])
def test_bad_workload_is_a_clear_error(tmp_path, spec, message):
    p = assess(tmp_path, spec, expect_rc=2)
    assert message in p.stderr and "Traceback" not in p.stderr


def test_workload_with_a_syntax_error_and_an_out_file_are_usage_errors(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\ndef f(:\n")
    p = assess(tmp_path, f"{bad}:f", expect_rc=2)  # (it exited 1)
    assert "invalid syntax" in p.stderr and "Traceback" not in p.stderr
    other = tmp_path / "other"
    other.mkdir()
    (other / "report").write_text("")  # --out names a file
    p = assess(other, "examples/workloads.py:cnn", expect_rc=2)
    assert "exists and is not a directory" in p.stderr and "FileExistsError" not in p.stderr
    p = subprocess.run([sys.executable, "-m", "torch_pjrt"], env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and "usage" in p.stderr  # no command (it exited 0)


def test_bad_config_is_a_clear_error(tmp_path):
    p = assess(tmp_path, "examples/workloads.py:cnn", config="[run]\nwarmpu = 3\n", expect_rc=2)
    assert "unknown setting" in p.stderr and "warmpu" in p.stderr
