"""PyTorch's own OpInfo samples on tpu vs CPU: a fixed, fast subset (forward and gradients,
float32 and int64, the first MAX_SAMPLES samples each).

The full run over every OpInfo is `python scripts/opinfo_report.py --full`, which prints the
per-op pass table and writes docs/opinfo.md; tests/opinfo_harness.py holds the rule for
which OpInfos count and how each check is classified.
"""
import pytest
import torch

import opinfo_harness as h
from conftest import TOLERANCES

# OpInfo names (name or name.variant_test_name). Every op here passes all its checks today;
# keep it fast (< 60 s in all) and add ops once their lowerings are in.
SUBSET = [
    "add", "sub", "mul", "div.no_rounding_mode", "neg", "abs", "exp", "log", "sqrt", "rsqrt",
    "tanh", "sigmoid", "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    "pow", "clamp", "where", "eq", "maximum",
    "sum", "mean", "amax", "argmax", "cumsum",
    "mm", "bmm", "addmm", "matmul", "nn.functional.linear",
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.cross_entropy",
    "cat", "index_select", "gather", "sort", "nn.functional.embedding",
    "nn.functional.conv2d", "nn.functional.batch_norm",
]
DTYPES = [torch.float32, torch.int64]
MAX_SAMPLES = 3


@pytest.fixture(scope="module")
def registry():
    h.load_op_db()
    return h.registry_names()


@pytest.mark.parametrize("name", SUBSET)
def test_opinfo_samples(name, registry):
    op = h.find_ops([name])[0]
    r = h.run_op(op, DTYPES, MAX_SAMPLES, grads=True, registry=registry)
    assert r.scope in ("direct", "composite"), f"{name}: {r.scope} ({r.note})"
    bad = [c for c in r.checks if c.status not in ("pass", "skip")]
    assert not bad, f"{name}: {len(bad)} of {len(r.checks)} checks fail:\n" + "\n".join(
        f"  {c.dtype} sample {c.sample} {c.kind}: {c.status}: {c.reason}" for c in bad)
    assert any(c.status == "pass" for c in r.checks), f"{name}: no sample ran ({r.note})"


def test_tolerances_match_conftest():
    assert h.TOLERANCES == TOLERANCES


def test_fallback_op_is_out_of_scope(registry):
    """An OpInfo whose sample needs a CPU fallback is not counted as lowered, and the
    check says which op fell back."""
    op = h.find_ops(["special.chebyshev_polynomial_t"])[0]
    r = h.run_op(op, [torch.float32], 1, registry=registry)
    assert r.scope == "not lowered"
    assert r.checks[-1].status == "fallback"
    assert any("special_chebyshev_polynomial_t" in f for f in r.checks[-1].fallbacks)


def test_random_ops_are_skipped(registry):
    for name in ("nn.functional.dropout", "bernoulli", "normal"):
        r = h.run_op(h.find_ops([name])[0], [torch.float32], 1, registry=registry)
        assert r.scope == "skipped", name
