"""Tiny random-weight Hugging Face and diffusers models on tpu against CPU:
forward output, a training step (loss, gradients, the loss after an SGD step)
and greedy generation, with no op through the CPU fallback. The families and
checks are in tests/hf_families.py; docs/huggingface.md shows their figures
(scripts/gen_hf_doc.py)."""

import pytest

pytest.importorskip("transformers")
import hf_families as hf  # noqa: E402
from hf_families import quiet_warnings  # noqa: E402, F401 (autouse in this module)

NAMES = list(hf.FAMILIES)
GENERATES = [n for n in NAMES if hf.FAMILIES[n].generates]


@pytest.mark.parametrize("name", NAMES)
def test_forward_matches_cpu(name):
    hf.assert_forward_matches(hf.FAMILIES[name])


@pytest.mark.parametrize("name", NAMES)
def test_training_step_matches_cpu(name):
    hf.assert_train_step_matches(hf.FAMILIES[name])


@pytest.mark.parametrize("name", GENERATES)
def test_greedy_generate_equals_cpu(name):
    hf.assert_generate_equals(hf.FAMILIES[name])


@pytest.mark.parametrize("name", ["GPT-2", "Llama", "T5"])
def test_static_cache_generate_runs_compiled_and_equals_cpu(name):
    """generate(cache_implementation="static"): transformers compiles the decode
    step with torch.compile's default backend, which sends tpu graphs to
    backend="tpu" (torch_pjrt/_compile/default_backend.py). The tokens are
    CPU's, and every decode step after the prefill ran as the compiled graph."""
    r = hf.assert_generate_equals(hf.FAMILIES[name], cache_implementation="static")
    assert r["dynamo_graphs"] >= 1 and r["compiled_graph_runs"] >= 7 and r["eager_graph_fallbacks"] == 0, r


@pytest.mark.parametrize("name", ["Llama", "T5", "ResNet"])
def test_fused_pipelined_training_matches_cpu(name):
    """Eight AdamW steps in fused eager, the loss read after each optimizer step:
    from the 3rd step each step is cut after its loss (pipelined flushes) and
    the losses stay CPU's."""
    r = hf.check_fused_training(hf.FAMILIES[name], steps=8)
    assert r["fallbacks"] == []
    assert r["cuts"] >= 1 and r["pipeline_flushes"] >= 6, r
    assert r["loss_rel_err"] <= hf.LOSS_RTOL, r
