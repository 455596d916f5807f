"""Defects of the assessment found by a sweep of odd workloads, each pinned
at the unit level (small models, the stage functions called in process):
outputs with no tensors, --hf classes and tokenizers, random forwards,
workload errors the baseline shares, batch sizes a model rejects, failing
ops in coverage, NaN and strict JSON, --baseline-only's device, config
checks, --quick and partial runs, and the report's wording."""
import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt  # noqa: F401  (the tpu device)
from torch_pjrt.assess import Workload, config, failures, numerics, verdict
from torch_pjrt.assess.coverage import op_coverage
from torch_pjrt.assess.performance import measure


def settings(**over):
    s, _ = config.load(overrides=over)
    return s


def seeded(cls):
    def make():
        torch.manual_seed(0)
        return cls()
    return make


class WrongFloatOnTpu(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        y = self.l(x)
        if x.device.type == "tpu":
            y = y * 3
        return {"total": y.sum().item(), "label": "text", "n": int(x.shape[0])}


class OnlyText(nn.Module):
    def forward(self, x):
        return "done"


class Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 8)

    def forward(self, x):
        return F.dropout(self.l(x), p=0.5, training=True)


class Logits(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 5)

    def forward(self, x):
        return self.l(x)


class FixedBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 4)

    def forward(self, x):
        return self.l(x.view(4, 16))  # only batch 4 works


def workload(cls, features=8, **kw):
    return Workload(name=cls.__name__, model=seeded(cls), make_inputs=lambda b: torch.randn(b, features),
                    **kw).validate()


def base_report(**over):
    r = {"workload": {"batch_sizes": [1, 8]}, "failures": [], "inventory": None, "coverage": None,
         "numerics": None, "performance": None, "memory": None, "cost": None,
         "stages": [{"name": n, "status": "ok"} for n in ("coverage", "numerics", "performance", "memory")]}
    r.update(over)
    return r


# ---- 1. outputs without tensors ----

def test_python_numbers_in_outputs_are_compared():
    n = numerics.compare_sides(workload(WrongFloatOnTpu), "cpu", ["eager"], 2, 1)
    rows = {r["name"]: r for r in n["outputs"]}
    assert rows["output['total']"]["dtype"] == "python float" and rows["output['total']"]["pass"] is False
    assert rows["output['n']"]["pass"] is True  # an int, equal on both sides
    assert n["pass"] is False and n["status"] == "measured"


def test_nothing_comparable_is_not_measured_and_blocks():
    n = numerics.compare_sides(workload(OnlyText), "cpu", ["eager"], 2, 1)
    assert n["pass"] is None and n["status"] == "nothing_compared" and "nothing comparable" in n["note"]
    v = verdict.decide(base_report(numerics=n), settings())
    assert {c["name"]: c["pass"] for c in v["criteria"]}["numerics"] is None
    assert any("nothing comparable" in b for b in v["blocking"]) and v["overall"] == "not ready"


# ---- 4. random ops in forward; the reference of top-1 agreement ----

def test_baseline_that_disagrees_with_itself_is_not_comparable():
    n = numerics.compare_sides(workload(Dropout, 16), "cpu", ["eager"], 4, 1)
    assert n["status"] == "not_comparable" and n["pass"] is None and "two baseline runs" in n["note"]
    assert all(r["pass"] is None for r in n["outputs"])
    v = verdict.decide(base_report(numerics=n), settings())
    assert not any(b.startswith("numerics") for b in v["blocking"])
    assert any("two baseline runs" in c for c in v["changes"])


def test_deterministic_model_is_measured_and_top1_baseline_is_a_reference():
    n = numerics.compare_sides(workload(Logits, 16), "cpu", ["eager"], 4, 1)
    assert n["status"] == "measured" and n["pass"] is True
    assert n["task_metric"]["baseline_is_reference"] is True
    v = verdict.decide(base_report(numerics=n), settings())
    assert "(reference 1)" in {c["name"]: c["value"] for c in v["criteria"]}["numerics"]


# ---- 2, 3. --hf: the saved class, an unusable tokenizer ----

def test_hf_loads_the_architecture_class_and_skips_an_empty_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    from torch_pjrt.assess import hf
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=32, num_labels=3)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(cfg).save_pretrained(tmp_path)  # no tokenizer files
    w = hf.workload(str(tmp_path))
    assert "BertForSequenceClassification" in w.source
    assert type(w.build_model()).__name__ == "BertForSequenceClassification"
    ids = w.make_inputs(2)["input_ids"]
    assert ids.shape == (2, hf.PROMPT_TOKENS) and int(ids.min()) >= 1  # the fixed ids, not (2, 0) or UNKs
    cfg.architectures = ["NoSuchModelClass"]
    assert hf.model_class_name(cfg) == "AutoModel" and hf.model_class_name(cfg, True) == "AutoModelForCausalLM"


def test_hf_generation_follows_the_class_not_its_name(tmp_path):
    """GPT2LMHeadModel and T5ForConditionalGeneration generate, though their
    names do not end in ForCausalLM; a classifier does not."""
    transformers = pytest.importorskip("transformers")
    from torch_pjrt.assess import hf
    tiny = dict(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(**tiny)).save_pretrained(tmp_path / "gpt2")
    t5 = transformers.T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                               decoder_start_token_id=0)
    transformers.T5ForConditionalGeneration(t5).save_pretrained(tmp_path / "t5")
    bert = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=32)
    transformers.BertForSequenceClassification(bert).save_pretrained(tmp_path / "bert")
    modes = {d: hf.workload(str(tmp_path / d)).mode for d in ("gpt2", "t5", "bert")}
    assert modes == {"gpt2": "generation", "t5": "generation", "bert": "inference"}
    w = hf.workload(str(tmp_path / "gpt2"))
    model = w.build_model().eval()
    out = model.generate(**w.make_inputs(2), max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (2, hf.PROMPT_TOKENS + 3)
    # graph breaks explain the plain forward: an encoder-decoder's needs its decoder's first token
    from torch_pjrt.assess import coverage
    count, breaks = coverage.graph_breaks(hf.workload(str(tmp_path / "t5")), 2)
    assert count >= 1


def test_hf_vision_and_audio_models_get_their_own_inputs(tmp_path):
    """A ViT or Whisper directory was given token ids: the baseline failed and
    the verdict blamed the workload. Inputs follow the class's main input."""
    transformers = pytest.importorskip("transformers")
    from torch_pjrt.assess import coverage, hf
    vit = transformers.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                 image_size=16, patch_size=8, num_channels=3, num_labels=3)
    transformers.ViTForImageClassification(vit).save_pretrained(tmp_path / "vit")
    whisper = transformers.WhisperConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
                                         encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                         decoder_ffn_dim=32, num_mel_bins=8, max_source_positions=10,
                                         max_target_positions=32, decoder_start_token_id=1, pad_token_id=0,
                                         eos_token_id=2, bos_token_id=1)
    transformers.WhisperForConditionalGeneration(whisper).save_pretrained(tmp_path / "whisper")
    w = hf.workload(str(tmp_path / "vit"))
    x = w.make_inputs(2)
    assert w.mode == "inference" and list(x) == ["pixel_values"] and x["pixel_values"].shape == (2, 3, 16, 16)
    assert torch.equal(x["pixel_values"], w.make_inputs(2)["pixel_values"])  # the same on every run
    assert w.build_model().eval()(**x).logits.shape == (2, 3)
    w = hf.workload(str(tmp_path / "whisper"))
    x = w.make_inputs(2)
    assert w.mode == "generation" and x["input_features"].shape == (2, 8, 20)
    out = w.build_model().eval().generate(**x, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    assert out.shape[0] == 2
    count, _ = coverage.graph_breaks(w, 2)  # the plain forward, with the decoder's first token
    assert count >= 1


class FakeTokenizer:
    def __init__(self, vocab, encode, unk=1):
        self.vocab, self.encode, self.unk_token_id = vocab, encode, unk

    def __len__(self):
        return self.vocab

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.encode(text)}


def test_unusable_tokenizers_are_detected():
    from torch_pjrt.assess.hf import usable_tokenizer
    assert not usable_tokenizer(None)
    assert not usable_tokenizer(FakeTokenizer(0, lambda t: [5]))           # empty vocabulary
    assert not usable_tokenizer(FakeTokenizer(5, lambda t: []))            # zero-length encodings
    assert not usable_tokenizer(FakeTokenizer(5, lambda t: [1, 1, 1]))     # all UNK
    assert usable_tokenizer(FakeTokenizer(100, lambda t: [1, 7, 9]))


# ---- 5. the workload's own errors ----

def test_failures_the_baseline_shares_are_workload_errors():
    fails = [failures.record("runtime_error", "numerics", "TypeError: linear(): not numpy", "baseline", 1),
             failures.record("unsupported_op", "coverage", "TypeError: linear(): not numpy", "eager", 1),
             failures.record("runtime_error", "performance", "TypeError: x", "compiled", 4),  # other batch
             failures.record("runtime_error", "performance", "RuntimeError: tpu only", "eager", 1),
             failures.record("out_of_memory", "memory", "OutOfMemoryError: x", "baseline", 8)]
    assert failures.mark_workload_errors(fails) == 2
    assert [f["kind"] for f in fails] == ["workload_error", "workload_error", "runtime_error", "runtime_error",
                                          "out_of_memory"]
    assert "fix the workload" in fails[1]["next_step"]


# ---- 6. batch sizes a model rejects ----

def test_each_batch_size_is_measured_on_its_own_and_baseline_failures_say_baseline():
    w = workload(FixedBatch, 16, batch_sizes=(1, 4, 8))
    phases = {"process_start": 0.0, "import": 0.0, "model_load": 0.0}
    row, lat, thr, fails = measure(w, "cpu", "eager", [1, 4, 8], 0, 2, phases)
    assert [r["batch_size"] for r in lat] == [4] and [r["frontend"] for r in thr] == ["baseline"]
    assert [(f["batch_size"], f["frontend"]) for f in fails] == [(1, "baseline"), (8, "baseline")]
    assert row["total"] is not None and row["batch_size"] == 4  # cold start timed on the batch that runs


def test_other_errors_at_a_batch_are_not_out_of_memory():
    mem = {"per_batch": [{"batch_size": 4, "status": "ok", "peak_bytes": 1},
                         {"batch_size": 8, "status": "failed", "peak_bytes": None,
                          "error": "RuntimeError: shape '[4, 16]' is invalid"}],
           "largest_batch": 4, "first_oom_batch": None, "limit_bytes": 40 << 20}
    v = verdict.decide(base_report(memory=mem), settings())
    crit = {c["name"]: c for c in v["criteria"]}["memory"]
    assert crit["pass"] is None and "shape '[4, 16]'" in crit["value"] and "40 MiB" in crit["threshold"]
    assert not any(b.startswith("memory") for b in v["blocking"])
    mem.update(first_oom_batch=8, per_batch=mem["per_batch"][:1])  # a real OOM at the required batch blocks
    v = verdict.decide(base_report(memory=mem), settings())
    assert any(b.startswith("memory: batch 8 does not fit") for b in v["blocking"])


# ---- 7. a failing op shows in coverage ----

class Sparse(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        return self.l(x).to_sparse().to_dense() * 2


def test_failing_op_shows_in_coverage():
    cov, failure = op_coverage(workload(Sparse), 2)
    assert failure is not None and cov["summary"]["failing"] >= 1
    assert any(o["class"] == "failing" for o in cov["ops"])


# ---- 8. NaN ----

def test_nan_is_reported_and_json_is_strict():
    b = torch.tensor([1.0, float("nan"), 2.0])
    row = numerics.compare("output", b, b.clone(), 1e-5, 1e-5)
    assert row["pass"] and row["nonfinite"]["baseline"]["nan"] == 1 and "both sides" in row["note"]
    row_t = numerics.compare("output", torch.ones(3), b, 1e-5, 1e-5)
    assert not row_t["pass"] and "tpu only" in row_t["note"]
    n = {"outputs": [{"frontend": "eager", **row}], "pass": True, "task_metric": None}
    v = verdict.decide(base_report(numerics=n), settings())
    assert any("NaN" in c for c in v["changes"]) and v["overall"] != "ready"
    from torch_pjrt.assess.runner import strict
    text = json.dumps(strict({"a": [math.nan, math.inf, 1.5], "b": {"c": -math.inf}}), allow_nan=False)
    assert json.loads(text) == {"a": [None, None, 1.5], "b": {"c": None}}


# ---- 9. --baseline-only without --device ----

def test_baseline_only_resolves_auto(tmp_path, monkeypatch):
    from torch_pjrt.assess import runner
    seen = []

    def fake_worker(request, work_dir, timeout, env_extra=None):
        seen.append(request["device"])
        return None, {"error": "stop here", "kind": "runtime_error"}
    monkeypatch.setattr(runner, "_run_worker", fake_worker)
    with pytest.raises(RuntimeError, match="stop here"):
        runner.capture_baseline("examples/workloads.py:cnn", str(tmp_path), "auto", progress=False)
    assert seen == [runner.baseline_device("auto")] and seen[0] in ("cpu", "cuda")


# ---- 10. config values ----

@pytest.mark.parametrize("over,message", [
    ({"run": {"batch_sizes": [0]}}, "run.batch_sizes"),
    ({"run": {"batch_sizes": [-2, 4]}}, "run.batch_sizes"),
    ({"thresholds": {"latency_p95_ms": "fast"}}, "thresholds.latency_p95_ms"),
    ({"memory": {"limit": "lots"}}, "memory.limit"),
    ({"memory": {"limit": 1.5}}, "memory.limit"),
    ({"numerics": {"batch_size": "x"}}, "numerics.batch_size"),
    ({"cost": {"job_items": 0}}, "cost.job_items"),
    ({"run": {"baseline_device": "cdua"}}, "cdua"),
    ({"memory": {"sweep_factor": 0}}, "memory.sweep_factor"),
])
def test_bad_config_values_are_refused_up_front(over, message):
    with pytest.raises(ValueError, match=message):
        config.load(overrides=over)


def test_good_config_values_still_load():
    for limit in (None, "48MiB", 1 << 30, 0.5, "50%", "0.25"):
        config.load(overrides={"memory": {"limit": limit}})
    config.load(overrides={"run": {"baseline_device": "cpu", "batch_sizes": [1, 2]},
                           "thresholds": {"latency_p95_ms": 50}})


# ---- 11. --quick and partial runs ----

def test_quick_keeps_the_configured_frontends(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[run]\nfrontends = ["eager"]\n')
    s, _ = config.load(str(p), quick=True)
    assert s["run"]["frontends"] == ["eager"] and s["run"]["iterations"] == config.QUICK["run"]["iterations"]


def test_partial_run_names_what_it_did_not_measure():
    n = {"outputs": [{"frontend": "eager", "name": "output", "pass": True}], "pass": True, "task_metric": None}
    stages = [{"name": "coverage", "status": "skipped"}, {"name": "numerics", "status": "ok"},
              {"name": "performance", "status": "skipped"}, {"name": "memory", "status": "failed"}]
    v = verdict.decide(base_report(numerics=n, stages=stages), settings())
    assert v["not_measured"] == ["coverage", "latency", "throughput", "memory"]
    values = {c["name"]: c["value"] for c in v["criteria"]}
    assert "not in run.stages" in values["coverage"] and "the stage failed" in values["memory"]


# ---- 12. wording ----

def test_repeated_blockers_are_kept_once():
    fails = [failures.record("runtime_error", stage, "RuntimeError: boom", "eager", bs)
             for stage, bs in (("performance", 1), ("performance", 8), ("memory", 16))]
    v = verdict.decide(base_report(failures=fails), settings())
    boom = [b for b in v["blocking"] if "boom" in b]
    assert len(boom) == 1 and "2 more like it" in boom[0]


def test_largest_batch_tile_is_neutral_when_nothing_was_measured():
    from torch_pjrt.assess import report
    ctx = report.context({"memory": {"per_batch": [], "largest_batch": None, "first_oom_batch": None,
                                     "limit_bytes": None}, "stages": []})
    tile = [t for t in ctx["tiles"] if t[0] == "largest batch"][0]
    assert tile[3] == "neutral"


def test_cli_refuses_a_bad_device_or_config_value_with_one_line(tmp_path, capsys):
    from torch_pjrt.__main__ import main
    cfg = tmp_path / "c.toml"
    for args, word in ((["--device", "cdua"], "cdua"), (["--config", str(cfg)], "run.batch_sizes")):
        cfg.write_text("[run]\nbatch_sizes = [0]\n")
        assert main(["assess", "examples/workloads.py:cnn", "--out", str(tmp_path / "r"), "--no-progress",
                     *args]) == 2
        err = capsys.readouterr().err.strip()
        assert word in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_baseline_worker_failures_are_labelled_baseline(tmp_path):
    import time
    from torch_pjrt.assess import runner, worker
    wl = tmp_path / "wl.py"
    wl.write_text("from torch_pjrt.assess import Workload\n"
                  "def broken_model():\n    raise RuntimeError('cannot build')\n"
                  "def w():\n    return Workload(name='w', model=broken_model, make_inputs=lambda b: None)\n")
    request = {"stage": "performance", "workload": f"{wl}:w", "device": "cpu", "frontend": "eager",
               "cache": "cold", "batch_sizes": [1], "warmup": 0, "iterations": 1, "spawn_time": time.time(),
               "out": str(tmp_path / "out.json"), "settings": settings()}
    path = tmp_path / "req.json"
    path.write_text(json.dumps(request))
    worker.main(str(path))  # the stage fails in the worker: its failure is the baseline's, not "eager"'s
    result = json.loads((tmp_path / "out.json").read_text())
    assert [f["frontend"] for f in result["failures"]] == ["baseline"]
    del request["out"], request["spawn_time"]
    _, fail = runner._run_worker(request, str(tmp_path), 0.001)  # a timeout of the baseline's worker
    assert fail["kind"] == "timeout" and fail["frontend"] == "baseline"
