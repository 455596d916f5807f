"""Random factories and `*_like` random ops under torch.compile(backend="tpu")
(`torch_pjrt/_compile/random_decomps.py`): part of the program (they ran in
pieces: PyTorch has no decomposition of them), drawing what eager draws for
the same seed (uniform and integer draws bit for bit; normal ones within one
rounding, XLA contracting a multiply-add in the fused program), and with the
range and moments of their distributions."""
import pytest
import torch

import torch_pjrt

N = (256, 256)

CASES = {
    "rand": (lambda x: torch.rand(x.shape, device=x.device), 0.0),
    "rand_like": (lambda x: torch.rand_like(x), 0.0),
    "rand_like float64": (lambda x: torch.rand_like(x, dtype=torch.float64), 0.0),
    "randint": (lambda x: torch.randint(0, 7, x.shape, device=x.device), 0.0),
    "randint low": (lambda x: torch.randint(3, 9, x.shape, device=x.device), 0.0),
    "randint int8": (lambda x: torch.randint(-5, 5, x.shape, device=x.device, dtype=torch.int8), 0.0),
    "randint_like": (lambda x: torch.randint_like(x, 5), 0.0),
    "randint_like low": (lambda x: torch.randint_like(x, 2, 6), 0.0),
    "randn": (lambda x: torch.randn(x.shape, device=x.device), 1e-6),
    "randn_like": (lambda x: torch.randn_like(x) * 2 + x, 1e-5),
    "normal_": (lambda x: torch.empty_like(x).normal_(3.0, 0.5), 1e-6),
}


@pytest.mark.parametrize("name", list(CASES))
def test_random_op_is_in_the_program_and_draws_as_eager(name):
    fn, atol = CASES[name]
    x = torch.zeros(N, device="tpu")
    torch._dynamo.reset()
    before = torch_pjrt.metrics()
    torch.manual_seed(3)
    compiled = torch.compile(fn, backend="tpu")(x).cpu()
    after = torch_pjrt.metrics()
    assert after["partitioned_graphs"] == before["partitioned_graphs"]
    assert after["eager_graph_fallbacks"] == before["eager_graph_fallbacks"]
    torch.manual_seed(3)
    eager = fn(x).cpu()
    assert compiled.dtype == eager.dtype and compiled.shape == eager.shape
    torch.testing.assert_close(compiled, eager, atol=atol, rtol=0)
    values = compiled.double()
    if name.startswith("rand") and not name.startswith("randn") and not name.startswith("randint"):
        assert 0 <= values.min() and values.max() < 1 and abs(values.mean() - 0.5) < 0.01
    elif name.startswith("randint"):
        lo, hi = {"randint": (0, 7), "randint low": (3, 9), "randint int8": (-5, 5), "randint_like": (0, 5),
                  "randint_like low": (2, 6)}[name]
        assert values.min() == lo and values.max() == hi - 1
    elif name == "normal_":
        assert abs(values.mean() - 3.0) < 0.01 and abs(values.std() - 0.5) < 0.01
    else:
        assert abs(values.mean()) < 0.02 and 0.98 < values.std() / (2 if name == "randn_like" else 1) < 1.02


def test_two_calls_draw_different_numbers_and_a_seed_repeats_them():
    fn = torch.compile(lambda x: x + torch.randn_like(x), backend="tpu")
    x = torch.zeros(64, device="tpu")
    torch.manual_seed(0)
    a, b = fn(x).cpu(), fn(x).cpu()
    torch.manual_seed(0)
    assert not torch.equal(a, b) and torch.equal(fn(x).cpu(), a)


@pytest.mark.parametrize("dtype,low,high", [(torch.int8, -100, 100), (torch.int16, -32768, 32767),
                                            (torch.int32, -2**31, 2**31 - 1), (torch.int64, -2**62, 2**62),
                                            (torch.int64, -2**63, 2**63 - 1)])
def test_randint_whose_span_does_not_fit_its_dtype(dtype, low, high):
    """high - low past the dtype's max (int8 -100..100) failed to lower, and an
    int64 span of 2**63 or more failed to trace; drawn in int64 (64 random
    bits modulo the span for the widest)."""
    fn = torch.compile(lambda x: torch.randint(low, high, (20000,), dtype=dtype, device=x.device), backend="tpu")
    values = fn(torch.zeros(1, device="tpu")).cpu()
    assert values.dtype == dtype and low <= int(values.min()) and int(values.max()) < high
    if dtype == torch.int8:
        assert values.unique().numel() == 200
    else:  # spread over the range: both ends' tenths are drawn
        span = high - low
        assert int(values.min()) < low + span // 10 and int(values.max()) > high - span // 10
    like = torch.compile(lambda x: torch.randint_like(x, low, high), backend="tpu")(
        torch.zeros(100, dtype=dtype, device="tpu")).cpu()
    assert low <= int(like.min()) and int(like.max()) < high
