"""The assessment's pure parts, fast: cost formula, verdict rules, failure
classes, config merging, the memory sweep and percentiles."""
import math

import pytest
import torch

from torch_pjrt.assess import config, cost, failures, verdict
from torch_pjrt.assess.memory import sweep_sizes
from torch_pjrt.assess.performance import percentile


def settings(**over):
    s, _ = config.load(overrides=over)
    return s


def perf(base_rate=100.0, tpu_rate=200.0):
    return {"cold_start": [{"frontend": "baseline", "cache": "cold", "total": 10.0, "warmup": 0.0},
                           {"frontend": "eager", "cache": "cold", "total": 20.0, "warmup": 1.0},
                           {"frontend": "eager", "cache": "warm", "total": 5.0}],
            "throughput": [{"frontend": "baseline", "batch_size": 8, "items_per_s": base_rate},
                           {"frontend": "eager", "batch_size": 8, "items_per_s": tpu_rate},
                           {"frontend": "eager", "batch_size": 16, "items_per_s": 999.0}],
            "latency": [{"frontend": "eager", "batch_size": 8, "p50": 0.01, "p95": 0.02, "p99": 0.03}]}


def test_cost_per_1000_items_formula():
    s = settings(prices={"baseline_per_device_hour": 3.6, "target_per_device_hour": 7.2, "target_devices": 2},
                 cost={"job_items": 10_000, "idle_share": 0.5, "retry_rate": 0.1})
    c = cost.estimate(perf(), s)
    rows = {r["side"]: r for r in c["rows"]}
    assert c["assumptions"]["batch_size"] == 8  # the largest batch both sides ran
    # baseline: (10 s start-up x 1000/10000 + 1000 / 100 x 1.1) / (1 - 0.5) = 24 s; 3.6 per hour
    assert rows["baseline"]["seconds_per_1000"] == pytest.approx(24.0)
    assert rows["baseline"]["cost_per_1000"] == pytest.approx(24.0 / 3600 * 3.6)
    # target: start-up 20 + 1 warm-up; (21 x 0.1 + 5 x 1.1) / 0.5 = 15.2 s, 2 devices, 7.2 per hour
    assert rows["target"]["seconds_per_1000"] == pytest.approx(15.2)
    assert rows["target"]["cost_per_1000"] == pytest.approx(15.2 * 2 / 3600 * 7.2)
    assert c["note"] is None


def test_cost_without_prices_is_device_seconds_only():
    c = cost.estimate(perf(), settings())
    assert all(r["cost_per_1000"] is None for r in c["rows"]) and "device-seconds" in c["note"]


def report(**over):
    r = {"workload": {"batch_sizes": [1, 8]}, "stages": [], "failures": [],
         "inventory": {"items": [], "summary": {"trivial": 0, "replace": 0, "rewrite": 0}},
         "coverage": {"ops": [{"op": "aten::mm", "count": 3, "class": "lowered"}],
                      "summary": {"lowered": 1, "decomposed": 0, "cpu_fallback": 0, "failing": 0},
                      "fallback_time_share": 0.0},
         "numerics": {"outputs": [{"frontend": "eager", "name": "output", "pass": True}], "pass": True,
                      "task_metric": None},
         "performance": perf(), "memory": {"largest_batch": 16, "limit_bytes": None},
         "cost": None}
    r.update(over)
    return r


def test_verdict_ready_and_its_criteria():
    v = verdict.decide(report(), settings())
    assert v["overall"] == "ready" and not v["blocking"] and not v["changes"]
    names = {c["name"]: c["pass"] for c in v["criteria"]}
    assert names["numerics"] and names["coverage"] and names["memory"] and names["latency"] is None


def test_verdict_changes_and_blockers():
    inv = {"items": [{"effort": "trivial", "detail": ".cuda()", "file": "m.py", "line": 3, "suggestion": "x"}],
           "summary": {"trivial": 1, "replace": 0, "rewrite": 0}}
    v = verdict.decide(report(inventory=inv), settings())
    assert v["overall"] == "ready after listed changes" and ".cuda()" in v["changes"][0]
    bad = {"outputs": [{"frontend": "eager", "name": "output", "pass": False, "max_abs": 1.0, "max_rel": 1.0,
                        "out_of_tolerance": 0.5, "rtol": 1e-5, "atol": 1e-5}], "pass": False, "task_metric": None}
    v = verdict.decide(report(numerics=bad), settings())
    assert v["overall"] == "not ready" and v["blocking"][0].startswith("numerics")
    v = verdict.decide(report(memory={"largest_batch": 4, "first_oom_batch": 8, "limit_bytes": 1 << 30}), settings())
    assert v["overall"] == "not ready" and any(b.startswith("memory") for b in v["blocking"])
    # The step failed at every batch (a model that raises): memory is not the blocker.
    v = verdict.decide(report(memory={"largest_batch": None, "first_oom_batch": None, "limit_bytes": None}),
                       settings())
    assert {c["name"]: c["pass"] for c in v["criteria"]}["memory"] is None
    assert not any(b.startswith("memory") for b in v["blocking"])
    v = verdict.decide(report(stages=[{"name": "performance", "status": "failed"}]), settings())
    assert v["overall"] == "not ready" and "stage performance did not complete" in v["blocking"]
    v = verdict.decide(report(), settings(thresholds={"latency_p95_ms": 1.0}))
    assert v["overall"] == "ready after listed changes"
    assert {c["name"]: c["pass"] for c in v["criteria"]}["latency"] is False


def test_failure_classes():
    assert failures.classify_exception(torch.OutOfMemoryError("tpu:0 is out of memory"))[0] == "out_of_memory"
    kind, op = failures.classify_exception(NotImplementedError("torch_pjrt: aten::foo.bar has no lowering"))
    assert kind == "unsupported_op" and op == "aten::foo.bar"
    assert failures.classify_exception(RuntimeError("compile failed in PJRT plugin 'cpu': x"))[0] == "compile_error"
    assert failures.classify_exception(RuntimeError("boom"))[0] == "runtime_error"
    wrapped = RuntimeError("backend failed")
    wrapped.__cause__ = torch.OutOfMemoryError("out of memory")
    assert failures.classify_exception(wrapped)[0] == "out_of_memory"
    rec = failures.from_exception(ValueError("x\n" * 100), "memory", "eager", 4)
    assert rec["stage"] == "memory" and rec["batch_size"] == 4 and rec["error"].count("\n") < 15
    with pytest.raises(AssertionError):
        failures.record("not_a_kind", "memory", "x")


def test_config_merge_and_errors(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[run]\niterations = 7\n[prices]\ntarget_per_device_hour = 1.5\n')
    s, d = config.load(str(p), quick=True)
    assert s["run"]["iterations"] == config.QUICK["run"]["iterations"]  # --quick wins over the file
    assert s["prices"]["target_per_device_hour"] == 1.5 and d["prices"]["target_per_device_hour"] is None
    for text, message in [("[run]\nwarmpu = 1\n", "unknown setting"), ("[run\n", "not valid TOML"),
                          ("[cost]\nidle_share = 1.5\n", "idle_share"), ("run = 3\n", "must be a table"),
                          ('[run]\nstages = ["inventory", "nope"]\n', "unknown stages")]:
        p.write_text(text)
        with pytest.raises(ValueError, match=message):
            config.load(str(p))


def test_memory_sweep_and_percentiles():
    assert sweep_sizes([1, 2, 4], 4) == [1, 2, 4, 8, 16]
    assert sweep_sizes([3], 1) == [3]
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 0.5) == pytest.approx(50.5) and percentile(xs, 0.99) == pytest.approx(99.01)
    assert percentile([], 0.5) is None and math.isclose(percentile([2.0], 0.95), 2.0)
