"""float16/bfloat16 results rounded where PyTorch's CPU kernels round them,
compared bit for bit (rtol = atol = 0) with CPU:
- a Python scalar or float32 0-dim operand of a half result is cast to the
  half type first (fp16 xlogy(x, 1e5) is inf there, atan2(x, 0.3) in bfloat16
  uses 0.30078);
- add/sub/rsub with alpha: alpha in the half type, self + alpha * other in
  float32, rounded once (SGD's param.add_(grad, alpha=-lr));
- xlogy/xlog1py round the log first; bfloat16 pow(x, 3) and pow(x, -2)
  round x * x first;
- index_add along the first or last dim of a 2+-d self (alpha 1, int64
  index) accumulates in float32, as CPU's scatter_add path does; elsewhere in
  the half type as CPU does."""
import pytest
import torch

import torch_pjrt  # noqa: F401
from conftest import tpu

HALF = [torch.bfloat16, torch.float16]


def same_bits(actual, expected):
    actual = actual.cpu()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("dt", HALF)
@pytest.mark.parametrize("alpha", [3, 0.1, -0.001])
def test_add_sub_alpha_round_once(dt, alpha):
    a, b = randn(4096, seed=1).to(dt), randn(4096, seed=2).to(dt)
    same_bits(tpu(a).add(tpu(b), alpha=alpha), a.add(b, alpha=alpha))
    same_bits(tpu(a).sub(tpu(b), alpha=alpha), a.sub(b, alpha=alpha))
    same_bits(torch.rsub(tpu(a), tpu(b), alpha=alpha), torch.rsub(a, b, alpha=alpha))
    same_bits(tpu(a).add(0.1, alpha=alpha), a.add(0.1, alpha=alpha))
    same_bits(torch._foreach_add([tpu(a)], [tpu(b)], alpha=alpha)[0], torch._foreach_add([a], [b], alpha=alpha)[0])


@pytest.mark.parametrize("dt", HALF)
def test_sgd_step_in_bfloat16_and_float16(dt):
    w, g = randn(8192, seed=3).to(dt), randn(8192, seed=4).to(dt)
    for p_dev in ("cpu", "tpu"):
        p = torch.nn.Parameter(w.clone().to(p_dev))
        p.grad = g.clone().to(p_dev)
        torch.optim.SGD([p], lr=0.01, foreach=False).step()
        if p_dev == "cpu":
            expected = p.detach()
        else:
            same_bits(p.detach(), expected)


SCALAR_CASES = {
    "pow_exponent": lambda x: x.pow(0.3),
    "pow_base": lambda x: torch.pow(10000.0, x),
    "pow_base_overflow": lambda x: torch.pow(1e5, x),
    "atan2": lambda x: torch.atan2(x, torch.tensor(0.3)),
    "atan2_first": lambda x: torch.atan2(torch.tensor(0.3), x),
    "atan2_overflow": lambda x: torch.atan2(x, torch.tensor(1e5)),
    "hypot": lambda x: torch.hypot(x, torch.tensor(0.3)),
    "logaddexp": lambda x: torch.logaddexp(x, torch.tensor(0.3)),
    "xlogy_overflow": lambda x: torch.xlogy(x, 1e5),
    "xlogy_underflow": lambda x: torch.xlogy(x, 1e-8),
    "xlogy_first": lambda x: torch.xlogy(1e5, x),
    "xlog1py_overflow": lambda x: torch.special.xlog1py(x, 1e5),
    "copysign": lambda x: torch.copysign(x, -0.3),
    "add": lambda x: x + 0.3,
    "mul": lambda x: x * 0.3,
}


@pytest.mark.parametrize("dt", HALF)
@pytest.mark.parametrize("case", sorted(SCALAR_CASES))
def test_scalar_operands_cast_to_the_half_type(dt, case):
    f = SCALAR_CASES[case]
    for x in (torch.linspace(0.01, 1, 64).to(dt), torch.tensor([1., 3., 1e-3, 300.], dtype=dt)):
        same_bits(f(tpu(x)), f(x))


@pytest.mark.parametrize("dt", HALF)
def test_xlogy_xlog1py_and_pow_intermediate_rounding(dt):
    x = randn(20000, seed=5, scale=3).to(dt)
    y = (torch.rand(20000, generator=torch.Generator().manual_seed(6)) * 5).to(dt)
    same_bits(torch.xlogy(tpu(x), tpu(y)), torch.xlogy(x, y))
    same_bits(torch.special.xlog1py(tpu(x), tpu(y)), torch.special.xlog1py(x, y))
    for e in (3, -2, 3.0, 2):
        same_bits(tpu(x).pow(e), x.pow(e))


@pytest.mark.parametrize("dt", HALF + [torch.float32])
@pytest.mark.parametrize("shape,dim", [((16, 64), 0), ((64, 16), 1), ((16, 64), -2), ((4, 16, 8), 1),
                                       ((4, 8, 16), 2), ((16,), 0)])
@pytest.mark.parametrize("alpha", [1, 2])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_index_add_accumulates_as_cpu(dt, shape, dim, alpha, index_dtype):
    g = torch.Generator().manual_seed(7)
    n = 4096
    src_shape = list(shape)
    src_shape[dim] = n
    idx = torch.randint(0, shape[dim], (n,), generator=g).to(index_dtype)
    src = (torch.randn(src_shape, generator=g) * 0.1).to(dt)
    base = torch.randn(shape, generator=g).to(dt)
    same_bits(tpu(base).index_add(dim, tpu(idx), tpu(src), alpha=alpha), base.index_add(dim, idx, src, alpha=alpha))


def test_index_add_compiled_matches_cpu():
    g = torch.Generator().manual_seed(8)
    idx = torch.randint(0, 16, (8192,), generator=g)
    src = (torch.randn(8192, 64, generator=g) * 0.1).bfloat16()
    base = torch.zeros(16, 64, dtype=torch.bfloat16)

    def f(b, i, s):
        return b.index_add(0, i, s)
    same_bits(torch.compile(f, backend="tpu")(tpu(base), tpu(idx), tpu(src)), f(base, idx, src))
