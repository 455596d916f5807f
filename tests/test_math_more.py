"""Ops that ran on the CPU fallback before: inverse trig/hyperbolic, the gamma
family, log2/exp2 and friends, binary math (atan2, hypot, logaddexp, fmax,
copysign, ...), shrink/PReLU, nansum, count_nonzero, aminmax, cummax/cummin,
take/put, cross, unfold/fold, searchsorted/bucketize, grid_sample, Cholesky and
triangular solves. Lowered (no CPU fallback) and equal to PyTorch on CPU,
special values and signed zeros included."""
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, assert_same, make, run_json, tpu

INF, NAN = math.inf, math.nan
# (No subnormals: XLA's transcendental functions take them as zero, log(1e-40)
# is -inf, as on TPUs; docs/reliability.md.)
SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.0, 8.0, 0.5, -2.5, 3.0, 1e-30, -1e-30, 1e30, 0.999, 1.001,
           INF, -INF, NAN, 100.0, -100.0, 0.25, -0.75]

# name -> (function, low, high): the random inputs' range keeps them in the domain.
UNARY = {
    "asin": (torch.asin, -0.99, 0.99),
    "acos": (torch.acos, -0.99, 0.99),
    "atan": (torch.atan, -5, 5),
    "asinh": (torch.asinh, -5, 5),
    "acosh": (torch.acosh, 1.01, 5),
    "atanh": (torch.atanh, -0.99, 0.99),
    "sinh": (torch.sinh, -4, 4),
    "cosh": (torch.cosh, -4, 4),
    "erfc": (torch.erfc, -3, 3),
    "erfinv": (torch.erfinv, -0.99, 0.99),
    "lgamma": (torch.lgamma, 0.1, 6),
    "digamma": (torch.digamma, 0.1, 6),
    "log2": (torch.log2, 0.01, 100),
    "log10": (torch.log10, 0.01, 100),
    "exp2": (torch.exp2, -10, 10),
    "sinc": (torch.sinc, -3, 3),
    "frac": (torch.frac, -5, 5),
    "signbit": (torch.signbit, -3, 3),
    "polygamma1": (lambda x: torch.polygamma(1, x), 0.2, 5),
    "polygamma2": (lambda x: torch.polygamma(2, x), 0.2, 5),
    "hardshrink": (F.hardshrink, -2, 2),
    "softshrink": (lambda x: F.softshrink(x, 0.7), -2, 2),
}

BINARY = {
    "atan2": torch.atan2,
    "hypot": torch.hypot,
    "logaddexp": torch.logaddexp,
    "logaddexp2": torch.logaddexp2,
    "fmax": torch.fmax,
    "fmin": torch.fmin,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "copysign": torch.copysign,
    "heaviside": torch.heaviside,
    "xlog1py": torch.special.xlog1py,
    "nextafter": torch.nextafter,
}


def same_bits(actual, expected, zero_signs=True):
    """Values equal (NaN where NaN) and zeros of the same sign."""
    a = actual.cpu()
    assert a.dtype == expected.dtype and a.shape == expected.shape
    torch.testing.assert_close(a, expected, rtol=0, atol=0, equal_nan=True)
    if not zero_signs:
        return
    zeros = expected == 0
    assert torch.equal(torch.signbit(a[zeros]), torch.signbit(expected[zeros])), "signed zeros differ"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_vs_cpu(name, dtype, no_cpu_fallback):
    fn, low, high = UNARY[name]
    x = make((4, 5), dtype, low=low, high=high)
    assert_same(fn(tpu(x)), fn(x))


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_special_values(name, no_cpu_fallback):
    fn = UNARY[name][0]
    x = torch.tensor(SPECIAL)
    if name == "polygamma1":  # CPU's trigamma is finite at negative integers (see unary_special.cpp)
        x = x[(x >= 0) | (x != x.floor())]
    expected, actual = fn(x), fn(tpu(x)).cpu()
    if name in ("hardshrink", "softshrink", "signbit", "frac"):
        # (CPU's softshrink gives -0.0 or 0.0 for small negatives depending on
        # whether its vectorized loop or the scalar tail computed them.)
        same_bits(actual, expected, zero_signs=name != "softshrink")
        return
    # Transcendental functions: XLA's approximations differ from glibc's in the
    # last bits and deep in the tails (lgamma/digamma near their poles).
    torch.testing.assert_close(actual, expected, rtol=2e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_polygamma_far_below_zero(n, dtype, no_cpu_fallback):
    # XLA's series alone is garbage below about -7 (wrong signs, 1e12).
    x = torch.tensor([-0.5, -2.5, -7.5, -9.5, -20.5, -30.2213, -123.4, 0.3, 3.0, 40.0], dtype=dtype)
    torch.testing.assert_close(torch.polygamma(n, tpu(x)).cpu(), torch.polygamma(n, x), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_integer_inputs_as_cpu(name, dtype):
    """Integer inputs promote to float where CPU does, and raise the same error where it does not."""
    fn = UNARY[name][0]
    x = make((3, 4), dtype, low=0 if name in ("acosh", "polygamma1") else -2, high=5)
    if name == "acosh":
        x = x + 1 if dtype != torch.bool else x
    try:
        expected = fn(x)
    except Exception as e:  # CPU has no kernel for this dtype
        with pytest.raises(type(e)):
            fn(tpu(x)).cpu()
        return
    assert_same(fn(tpu(x)), expected)


def test_erf_stays_within_one(no_cpu_fallback):
    # float32 chlo.erf passed 1 by up to 2 ulps on 3.72 <= |x| < 3.92:
    # Normal(0, 1).cdf(-5.2578) was -6e-8 and its log NaN.
    x = torch.linspace(3.6, 4.0, 40001)
    x = torch.cat([x, -x, torch.tensor([float("nan"), 0.0, -0.0])])
    got = torch.erf(tpu(x))
    assert_same(got, torch.erf(x), atol=3e-7, rtol=0)  # (CHLO: up to 5 ulps below 1)
    got = got.cpu()
    assert got[:-3].abs().max().item() <= 1.0
    assert math.isnan(got[-3].item()) and math.copysign(1, got[-1].item()) == -1
    normal = torch.distributions.Normal(tpu(torch.tensor(0.0)), tpu(torch.tensor(1.0)))
    cdf = normal.cdf(tpu(torch.tensor([-5.25786591, -5.4, -5.2]))).cpu()
    assert (cdf >= 0).all() and not cdf.log().isnan().any(), cdf


def test_erfinv_tails_in_float32(no_cpu_fallback):
    # CHLO's float32 erfinv was up to 63 ulps off on 0.9985 <= |x| < 0.99997
    # (relative 5.6e-6; CPU 0.5 ulp): Normal.icdf's tails.
    x = torch.linspace(0.9, 1.0, 200001)[:-1]
    x = torch.cat([x, -x, torch.tensor([-0.999830008, 0.9995])])
    expected = torch.erfinv(x.double()).float()
    assert_same(torch.erfinv(tpu(x)), expected, rtol=2.5e-7, atol=0)
    assert torch.erfinv(tpu(torch.tensor([1.0, -1.0, 1.5]))).cpu().tolist()[:2] == [math.inf, -math.inf]


def test_log2_and_exp2_exact_at_powers_of_two(no_cpu_fallback):
    k = torch.arange(-126, 128, dtype=torch.float32)  # normal numbers
    p = torch.exp2(k)
    same_bits(torch.log2(tpu(p)), torch.log2(p))
    same_bits(torch.exp2(tpu(k)), p)
    assert torch.log2(tpu(torch.tensor(8.0))).floor().item() == 3.0
    d = torch.arange(-1000, 1000, 7, dtype=torch.float64)
    same_bits(torch.log2(tpu(torch.exp2(d))), d)


def test_log2_near_one_keeps_relative_precision(no_cpu_fallback):
    x = torch.tensor([1 - 2.0 ** -k for k in range(2, 24)] + [1 + 2.0 ** -k for k in range(2, 23)])
    torch.testing.assert_close(torch.log2(tpu(x)).cpu(), torch.log2(x), rtol=3e-7, atol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_vs_cpu(name, dtype, no_cpu_fallback):
    fn = BINARY[name]
    a, b = make((4, 5), dtype, seed=1), make((4, 5), dtype, seed=2)
    if name == "heaviside":
        a[0] = 0
    if name == "xlog1py":
        b = b.abs()
    assert_same(fn(tpu(a), tpu(b)), fn(a, b))


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_special_value_grid(name, no_cpu_fallback):
    """Every pair of special values, broadcast (a column against a row)."""
    fn = BINARY[name]
    v = torch.tensor(SPECIAL)
    a, b = v[:, None], v[None, :]
    expected, actual = fn(a, b), fn(tpu(a), tpu(b)).cpu()
    if name in ("fmax", "fmin", "maximum", "minimum", "copysign", "heaviside", "nextafter"):
        # (CPU's maximum/minimum give either operand on ties of -0.0 and 0.0,
        # depending on its loop: vectorized or not.)
        same_bits(actual, expected, zero_signs=name not in ("maximum", "minimum"))
    else:
        torch.testing.assert_close(actual, expected, rtol=2e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("dtypes", [(torch.int64, torch.int64), (torch.int32, torch.float32),
                                    (torch.bool, torch.bool), (torch.uint8, torch.int8)])
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_integer_inputs_as_cpu(name, dtypes):
    fn = BINARY[name]
    a, b = make((3, 4), dtypes[0], seed=3), make((3, 4), dtypes[1], seed=4)
    try:
        expected = fn(a, b)
    except Exception as e:
        with pytest.raises(type(e)):
            fn(tpu(a), tpu(b)).cpu()
        return
    assert_same(fn(tpu(a), tpu(b)), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hypot_and_complex_sgn_round_as_cpu(dtype, no_cpu_fallback):
    # std::hypot is within half an ulp; max * sqrt(1 + (min/max)^2) was an ulp
    # off for a third of values (complex sgn divides by |z| the same way).
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(50000, dtype=dtype, generator=g) * 10, torch.randn(50000, dtype=dtype, generator=g) * 10
    assert torch.equal(torch.hypot(a.to("tpu"), b.to("tpu")).cpu(), torch.hypot(a, b))
    z = torch.complex(a, b)
    got, want = z.to("tpu").sgn().cpu(), z.sgn()
    # (complex64: CPU's vectorized division differs in the last bit for ~1 in 10,000)
    assert (got != want).sum() <= (0 if dtype == torch.float64 else 20)
    torch.testing.assert_close(got, want, rtol=2 * torch.finfo(dtype).eps, atol=0)


@pytest.mark.parametrize("name", ["atan2", "copysign", "fmax", "xlog1py", "hypot"])
def test_binary_scalar_and_inplace_forms(name, no_cpu_fallback):
    a, b = make((3, 4), seed=5), make((3, 4), seed=6).abs()
    fn = BINARY[name]
    assert_same(fn(tpu(a), tpu(b)[0]), fn(a, b[0]))  # broadcast
    method = getattr(torch.Tensor, name + "_", None)
    if method is not None:
        x, y = a.clone(), tpu(a)
        method(x, b)
        method(y, tpu(b))
        assert_same(y, x)
    out = torch.empty(3, 4, device="tpu")
    fn(tpu(a), tpu(b), out=out)
    assert_same(out, fn(a, b))


def test_copysign_with_a_scalar_and_negative_zero(no_cpu_fallback):
    x = torch.tensor([1.0, -2.0, 0.0, NAN])
    same_bits(torch.copysign(tpu(x), -0.0), torch.copysign(x, -0.0))
    same_bits(torch.copysign(tpu(x), 3), torch.copysign(x, 3))


@pytest.mark.parametrize("fn", [torch.maximum, torch.minimum, torch.fmax, torch.fmin])
def test_max_min_ties_like_cpus_vectorized_loop(fn, no_cpu_fallback):
    a = torch.tensor([-0.0, 0.0, -0.0, 0.0, NAN, 1.0, NAN, 2.0]).repeat(8)
    b = torch.tensor([0.0, -0.0, -0.0, 0.0, 1.0, NAN, NAN, 2.0]).repeat(8)
    same_bits(fn(tpu(a), tpu(b)), fn(a, b))


@pytest.mark.parametrize("kw", [dict(min=0.0), dict(max=-0.0), dict(min=-0.0, max=0.0), dict(min=0.0, max=-0.0)])
def test_clamp_keeps_self_on_ties(kw, no_cpu_fallback):
    x = torch.tensor([-0.0, 0.0, NAN, -1.0, 1.0])
    same_bits(x.to("tpu").clamp(**kw), x.clamp(**kw))


GRAD_FNS = {
    "asin": (torch.asin, -0.9, 0.9), "acos": (torch.acos, -0.9, 0.9), "atan": (torch.atan, -3, 3),
    "asinh": (torch.asinh, -3, 3), "acosh": (torch.acosh, 1.1, 3), "atanh": (torch.atanh, -0.9, 0.9),
    "sinh": (torch.sinh, -3, 3), "cosh": (torch.cosh, -3, 3), "erfc": (torch.erfc, -2, 2),
    "erfinv": (torch.erfinv, -0.9, 0.9), "lgamma": (torch.lgamma, 0.5, 4), "digamma": (torch.digamma, 0.5, 4),
    "log2": (torch.log2, 0.1, 4), "log10": (torch.log10, 0.1, 4), "exp2": (torch.exp2, -3, 3),
    "sinc": (torch.sinc, -2, 2), "frac": (torch.frac, -3, 3),
    "hardshrink": (F.hardshrink, -2, 2), "softshrink": (F.softshrink, -2, 2),
}


@pytest.mark.parametrize("name", list(GRAD_FNS))
def test_unary_gradients(name):
    fn, low, high = GRAD_FNS[name]
    x = make((3, 4), torch.float32, low=low, high=high, seed=7)
    xc, xt = x.clone().requires_grad_(), tpu(x).requires_grad_()
    g = make((3, 4), seed=8)
    fn(xc).backward(g)
    fn(xt).backward(tpu(g))
    assert_same(xt.grad, xc.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["atan2", "hypot", "logaddexp", "logaddexp2", "fmax", "copysign", "xlog1py"])
def test_binary_gradients(name):
    fn = BINARY[name]
    a, b = make((3, 4), seed=9), make((3, 4), seed=10).abs() + 0.1
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    at, bt = tpu(a).requires_grad_(), tpu(b).requires_grad_()
    fn(ac, bc).sum().backward()
    fn(at, bt).sum().backward()
    assert_same(at.grad, ac.grad, rtol=1e-4, atol=1e-5)
    assert_same(bt.grad, bc.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("num_parameters", [1, 3])
def test_prelu_module_trains_like_cpu(num_parameters, no_cpu_fallback):
    torch.manual_seed(0)
    cpu_m = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.PReLU(num_parameters))
    tpu_m = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.PReLU(num_parameters)).to("tpu")
    tpu_m.load_state_dict(cpu_m.state_dict())
    opt_c = torch.optim.SGD(cpu_m.parameters(), lr=0.1)
    opt_t = torch.optim.SGD(tpu_m.parameters(), lr=0.1)
    for step in range(3):
        x = make((2, 2, 6, 6), seed=step)
        for m, opt, inp in ((cpu_m, opt_c, x), (tpu_m, opt_t, tpu(x))):
            opt.zero_grad()
            m(inp).square().mean().backward()
            opt.step()
    for (n, pc), pt in zip(cpu_m.named_parameters(), tpu_m.parameters()):
        assert_same(pt, pc.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", [{}, dict(dim=1), dict(dim=(0, 2), keepdim=True), dict(dtype=torch.float64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_nansum(kw, dtype, no_cpu_fallback):
    x = make((3, 4, 5), dtype)
    if dtype.is_floating_point:
        x[0, 1, 2] = NAN
        x[2, 3] = NAN
    # (bfloat16: CPU rounds partial sums over non-adjacent dims to bfloat16.)
    tol = dict(rtol=5e-2, atol=5e-2) if dtype == torch.bfloat16 else {}
    assert_same(torch.nansum(tpu(x), **kw), torch.nansum(x, **kw), **tol)
    if dtype.is_floating_point and "dtype" not in kw:
        assert_same(torch.nanmean(tpu(x), **kw), torch.nanmean(x, **kw))


@pytest.mark.parametrize("dim", [None, 0, (0, 1), -1, ()])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_count_nonzero(dim, dtype, no_cpu_fallback):
    x = make((3, 4, 2), dtype, low=-1, high=1)
    kw = {} if dim is None else dict(dim=dim)
    assert_same(torch.count_nonzero(tpu(x), **kw), torch.count_nonzero(x, **kw))


@pytest.mark.parametrize("kw", [{}, dict(dim=1), dict(dim=-1, keepdim=True), dict(dim=0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.bool])
def test_aminmax(kw, dtype, no_cpu_fallback):
    x = make((3, 4), dtype)
    if dtype.is_floating_point:
        x[1, 2] = NAN
    assert_same(torch.aminmax(tpu(x), **kw), torch.aminmax(x, **kw))
    s = make((), dtype)
    assert_same(torch.aminmax(tpu(s), dim=0), torch.aminmax(s, dim=0))


@pytest.mark.parametrize("kw,error", [({}, RuntimeError), (dict(dim=0), IndexError)])
def test_aminmax_of_nothing_raises_like_cpu(kw, error):
    with pytest.raises(error, match="aminmax"):
        torch.aminmax(torch.empty(0, 3), **kw)
    with pytest.raises(error, match="aminmax"):
        torch.aminmax(torch.empty(0, 3, device="tpu"), **kw)
    assert_same(torch.aminmax(torch.empty(0, 3, device="tpu"), dim=1), torch.aminmax(torch.empty(0, 3), dim=1))


@pytest.mark.parametrize("fn", [torch.cummax, torch.cummin])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int8, torch.bool])
def test_cummax_cummin_values_and_indices(fn, dtype, no_cpu_fallback):
    """Ties go to the later index, NaN wins and a later NaN takes over, as on CPU."""
    x = make((3, 37), dtype, low=-2, high=2)  # few distinct values: many ties
    if dtype.is_floating_point:
        x[0, 5] = NAN
        x[0, 20] = NAN
        x[1, 0] = NAN
    for dim in (0, 1, -1):
        assert_same(fn(tpu(x), dim), fn(x, dim))
    assert_same(fn(tpu(make((), dtype)), 0), fn(make((), dtype), 0))
    assert_same(fn(tpu(torch.empty(0, 3, dtype=dtype)), 0), fn(torch.empty(0, 3, dtype=dtype), 0))


def test_cummax_gradient():
    x = make((4, 9), seed=11)
    xc, xt = x.clone().requires_grad_(), tpu(x).requires_grad_()
    torch.cummax(xc, 1).values.sum().backward()
    torch.cummax(xt, 1).values.sum().backward()
    assert_same(xt.grad, xc.grad)


def test_take_and_its_gradient(no_cpu_fallback):
    x = make((3, 4), seed=12)
    idx = torch.tensor([[0, -1], [11, 5], [5, 5]])
    assert_same(torch.take(tpu(x), tpu(idx)), torch.take(x, idx))
    assert_same(torch.take(tpu(make(())), tpu(torch.tensor([0, -1]))), torch.take(make(()), torch.tensor([0, -1])))
    xc, xt = x.clone().requires_grad_(), tpu(x).requires_grad_()
    torch.take(xc, idx).sum().backward()  # repeated indices accumulate (put_ with accumulate)
    torch.take(xt, tpu(idx)).sum().backward()
    assert_same(xt.grad, xc.grad)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_put(accumulate, dtype, no_cpu_fallback):
    x = make((2, 3), dtype, seed=13)
    idx = torch.tensor([[0, -1], [4, 2]]) if not accumulate else torch.tensor([[0, -1], [5, 0]])
    src = make((2, 2), dtype, seed=14)
    assert_same(tpu(x).put_(tpu(idx), tpu(src), accumulate=accumulate), x.clone().put_(idx, src, accumulate=accumulate))
    assert_same(tpu(x).put(tpu(idx), tpu(src), accumulate=accumulate), x.put(idx, src, accumulate=accumulate))


@pytest.mark.parametrize("op", ["take", "put_"])
def test_take_put_out_of_range_raise_index_error(op):
    x = torch.zeros(2, 3, device="tpu")
    idx = torch.tensor([6], device="tpu")
    with pytest.raises(IndexError, match="out of range"):
        r = torch.take(x, idx) if op == "take" else x.put_(idx, torch.ones(1, device="tpu"))
        r.cpu()
    with pytest.raises(IndexError, match="empty tensor"):
        e = torch.empty(0, device="tpu")
        torch.take(e, idx) if op == "take" else e.put_(idx, torch.ones(1, device="tpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_linalg_cross(dtype, no_cpu_fallback):
    a, b = make((4, 3), dtype, seed=15), make((1, 3), dtype, seed=16)
    assert_same(torch.linalg.cross(tpu(a), tpu(b)), torch.linalg.cross(a, b))
    a, b = make((3, 5), dtype, seed=17), make((3, 5), dtype, seed=18)
    assert_same(torch.cross(tpu(a), tpu(b), dim=0), torch.cross(a, b, dim=0))
    if dtype.is_floating_point:
        ac, at = a.clone().requires_grad_(), tpu(a).requires_grad_()
        torch.cross(ac, b, dim=0).sum().backward()
        torch.cross(at, tpu(b), dim=0).sum().backward()
        assert_same(at.grad, ac.grad)


UNFOLD_CASES = [((2, 3, 5, 6), dict(kernel_size=(2, 3), dilation=(1, 2), padding=(1, 0), stride=(2, 1))),
                ((3, 5, 6), dict(kernel_size=2)), ((1, 2, 7, 7), dict(kernel_size=3, padding=1, stride=2)),
                ((2, 4, 4, 4), dict(kernel_size=1)), ((0, 2, 4, 4), dict(kernel_size=2))]


@pytest.mark.parametrize("shape,kw", UNFOLD_CASES)
def test_unfold_fold_and_gradient(shape, kw, no_cpu_fallback):
    x = make(shape, seed=19)
    xc, xt = x.clone().requires_grad_(), tpu(x).requires_grad_()
    c, t = F.unfold(xc, **kw), F.unfold(xt, **kw)
    same_bits(t.detach(), c.detach())  # copies of values: exact
    g = make(tuple(c.shape), seed=20)
    c.backward(g)
    t.backward(tpu(g))
    assert_same(xt.grad, xc.grad)
    assert_same(F.fold(t.detach(), shape[-2:], **kw), F.fold(c.detach(), shape[-2:], **kw))


def test_unfold_keeps_inf_beside_a_window(no_cpu_fallback):
    x = torch.tensor([[[[1.0, INF, 2.0], [3.0, 4.0, NAN], [6.0, 7.0, 8.0]]]])
    same_bits(F.unfold(tpu(x), 2), F.unfold(x, 2))


def _search_cases():
    s = torch.tensor([1.0, 2.0, 2.0, 3.0, NAN])  # a NaN at the end, as sort puts it
    v = torch.tensor([[0.0, 1.0, 2.0, 2.5, 3.0, 4.0, NAN]])
    rows = torch.sort(make((3, 9), seed=21), -1).values
    u = make((7,), seed=22)
    return [(s, v, {}), (s, v, dict(right=True)), (s, v, dict(side="right", out_int32=True)),
            (rows, make((3, 4), seed=23), {}), (rows, make((3, 4), seed=23), dict(right=True)),
            (u, make((5,), seed=24), dict(sorter=torch.argsort(u))),
            (torch.tensor([1, 3, 5, 7]), torch.tensor([0, 3, 4, 8]), {}),
            (torch.tensor([1, 3, 5, 7]), torch.tensor([0.5, 3.0, 8.0]), {}),  # promoted
            (torch.tensor([1.0]), torch.tensor([0.0, 1.0, 2.0]), {}),
            (torch.tensor([]), torch.tensor([1.0]), {}),
            (torch.tensor([3.0, 1.0, 2.0]), torch.tensor([1.5, 2.5]), {})]  # unsorted: CPU's search path


@pytest.mark.parametrize("case", range(11))
def test_searchsorted_as_cpus_binary_search(case, no_cpu_fallback):
    seq, val, kw = _search_cases()[case]
    kwt = {k: tpu(x) for k, x in kw.items()}
    assert_same(torch.searchsorted(tpu(seq), tpu(val), **kwt), torch.searchsorted(seq, val, **kw))


@pytest.mark.parametrize("right", [False, True])
def test_bucketize(right, no_cpu_fallback):
    b = torch.tensor([0.0, 1.0, 5.0])
    x = torch.tensor([[-1.0, 0.0, 0.5, 1.0, 7.0, NAN]])
    assert_same(torch.bucketize(tpu(x), tpu(b), right=right), torch.bucketize(x, b, right=right))
    assert_same(torch.bucketize(3, tpu(b), right=right), torch.bucketize(3, b, right=right))
    assert_same(torch.searchsorted(tpu(b), 1.0, right=right), torch.searchsorted(b, 1.0, right=right))


def test_bucketize_rejects_cpu_boundaries_as_cuda_does():
    with pytest.raises(RuntimeError, match="same device"):
        torch.bucketize(torch.ones(3, device="tpu"), torch.tensor([0.0, 1.0]))


def test_searchsorted_sorter_out_of_range_raises():
    with pytest.raises(RuntimeError, match="sorter index out of range"):
        torch.searchsorted(torch.tensor([1.0, 2.0], device="tpu"), torch.tensor([1.0], device="tpu"),
                           sorter=torch.tensor([0, 5], device="tpu")).cpu()


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample(mode, padding, align, no_cpu_fallback):
    x = make((2, 3, 7, 9), seed=25)
    g = make((2, 5, 6, 2), low=-1.3, high=1.3, seed=26)  # some points outside the image
    g[0, 0, 0] = torch.tensor([1.0, -1.0])  # corners and exact pixel centres
    g[1, 2, 3] = torch.tensor([0.0, 0.0])
    kw = dict(mode=mode, padding_mode=padding, align_corners=align)
    xc, gc, xt, gt = x.clone().requires_grad_(), g.clone().requires_grad_(), tpu(x).requires_grad_(), tpu(g).requires_grad_()
    c, t = F.grid_sample(xc, gc, **kw), F.grid_sample(xt, gt, **kw)
    assert_same(t.detach(), c.detach(), rtol=1e-5, atol=1e-5)
    w = make(tuple(c.shape), seed=34)
    c.backward(w)
    t.backward(tpu(w))
    assert_same(xt.grad, xc.grad, rtol=1e-5, atol=1e-5)
    assert_same(gt.grad, gc.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_grid_sample_dtypes_and_gradients(dtype, no_cpu_fallback):
    x = make((1, 2, 5, 5), dtype, seed=27)
    g = make((1, 3, 4, 2), dtype, low=-1.1, high=1.1, seed=28)
    assert_same(F.grid_sample(tpu(x), tpu(g), align_corners=False), F.grid_sample(x, g, align_corners=False))
    xc, gc = x.clone().requires_grad_(), g.clone().requires_grad_()
    xt, gt = tpu(x).requires_grad_(), tpu(g).requires_grad_()
    F.grid_sample(xc, gc, align_corners=True).sum().backward()
    F.grid_sample(xt, gt, align_corners=True).sum().backward()
    assert_same(xt.grad, xc.grad)
    assert_same(gt.grad, gc.grad)


def test_grid_sample_bad_input_raises_like_cpu():
    for x, g in [((2, 3, 4, 4), (3, 2, 2, 2)), ((2, 3, 4, 4), (2, 2, 2, 3)), ((1, 3, 0, 4), (1, 2, 2, 2))]:
        with pytest.raises(RuntimeError, match="grid_sampler"):
            F.grid_sample(torch.zeros(x), torch.zeros(g), align_corners=False)
        with pytest.raises(RuntimeError, match="grid_sampler"):
            F.grid_sample(torch.zeros(x, device="tpu"), torch.zeros(g, device="tpu"), align_corners=False).cpu()


def _spd(batch=(3,), n=4, seed=29):
    m = make(batch + (n, n), seed=seed)
    return m @ m.transpose(-1, -2) + n * torch.eye(n)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_and_its_gradient(upper, no_cpu_fallback):
    a = _spd()
    c, t = torch.linalg.cholesky_ex(a, upper=upper), torch.linalg.cholesky_ex(tpu(a), upper=upper)
    assert_same(t.L, c.L)
    assert_same(t.info, c.info)
    assert_same(torch.cholesky(tpu(a[0]), upper=upper), torch.cholesky(a[0], upper=upper))
    ac, at = a.clone().requires_grad_(), tpu(a).requires_grad_()
    torch.linalg.cholesky(ac, upper=upper).square().sum().backward()
    torch.linalg.cholesky(at, upper=upper).square().sum().backward()
    assert_same(at.grad, ac.grad, rtol=1e-4, atol=1e-5)


def test_cholesky_of_a_matrix_that_is_not_positive_definite():
    a = _spd()
    a[1] = torch.tensor([[1.0, 2, 0, 0], [2, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    info = torch.linalg.cholesky_ex(tpu(a)).info.cpu()
    # Non-zero exactly where CPU's is (its order may be earlier: docs in linalg.cpp).
    assert torch.equal(info != 0, torch.linalg.cholesky_ex(a).info != 0)
    with pytest.raises(torch.linalg.LinAlgError, match="not positive-definite"):
        torch.linalg.cholesky(tpu(a)).cpu()
    # Both raise at the call, as on CPU (no host read needed), with CPU's message.
    for fn in (torch.linalg.cholesky, torch.cholesky):
        for x in (a, a[1]):
            with pytest.raises(torch.linalg.LinAlgError) as got:
                fn(tpu(x))
            with pytest.raises(torch.linalg.LinAlgError) as want:
                fn(x)
            assert str(got.value) == str(want.value)


@pytest.mark.parametrize("unit", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("upper", [False, True])
def test_solve_triangular(upper, left, unit, no_cpu_fallback):
    factor = torch.linalg.cholesky(_spd())
    a = factor.transpose(-1, -2) if upper else factor
    b = make((3, 4, 2), seed=30)
    b = b if left else b.transpose(-1, -2)
    kw = dict(upper=upper, left=left, unitriangular=unit)
    assert_same(torch.linalg.solve_triangular(tpu(a), tpu(b), **kw), torch.linalg.solve_triangular(a, b, **kw))
    assert_same(torch.linalg.solve_triangular(tpu(a[0]), tpu(b), **kw), torch.linalg.solve_triangular(a[0], b, **kw))


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("upper", [False, True])
def test_triangular_solve_cholesky_solve_and_inverse(upper, transpose, no_cpu_fallback):
    factor = torch.linalg.cholesky(_spd())
    a = factor.transpose(-1, -2) if upper else factor
    b = make((3, 4, 2), seed=31)
    assert_same(torch.triangular_solve(tpu(b), tpu(a), upper=upper, transpose=transpose),
                torch.triangular_solve(b, a, upper=upper, transpose=transpose))
    assert_same(torch.cholesky_solve(tpu(b), tpu(a), upper=upper), torch.cholesky_solve(b, a, upper=upper),
                rtol=1e-4, atol=1e-5)
    assert_same(torch.cholesky_inverse(tpu(a[0]), upper=upper), torch.cholesky_inverse(a[0], upper=upper),
                rtol=1e-4, atol=1e-5)


def test_multivariate_normal_runs_on_the_device(no_cpu_fallback):
    from torch.distributions import MultivariateNormal
    cov, mu, x = _spd()[0], make((4,), seed=32), make((5, 4), seed=33)
    c, t = MultivariateNormal(mu, cov), MultivariateNormal(tpu(mu), tpu(cov))
    assert_same(t.log_prob(tpu(x)), c.log_prob(x), rtol=1e-5, atol=1e-5)
    assert_same(t.entropy(), c.entropy())
    assert t.rsample((3,)).shape == (3, 4)


def test_equal_on_the_device(no_cpu_fallback):
    x = make((3, 4), seed=40)
    nan = torch.tensor([1.0, float("nan")])
    for a, b in [(x, x.clone()), (x, x + 1), (x, x[:2]), (x, x.double()), (x, x.long()), (nan, nan),
                 (torch.zeros(0), torch.zeros(0)), (x, x.t().contiguous().t())]:
        assert torch.equal(tpu(a), tpu(b)) == torch.equal(a, b)
    with pytest.raises(RuntimeError, match="different devices"):  # as on CUDA
        torch.equal(tpu(x), x)


@pytest.mark.parametrize("name", ["sinh", "cosh"])
def test_sinh_cosh_float32_within_four_ulp_everywhere(name, no_cpu_fallback):
    # (XLA's expansion alone was 5-12 ulp off above |x| = 5, and is ~3 below |x| = 1; float64 reference.)
    x = torch.linspace(-89.4, 89.4, 20001)
    ref = getattr(torch, name)(x.double())
    actual = getattr(torch, name)(tpu(x)).cpu().double()
    err = ((actual - ref).abs() / ref.abs().clamp_min(1e-30)) / torch.finfo(torch.float32).eps
    assert err.max().item() < 4.0
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-30])
    torch.testing.assert_close(getattr(torch, name)(tpu(special)).cpu(), getattr(torch, name)(special), equal_nan=True)
    z = torch.tensor([1 + 2j, -3 + 0.5j, 20 - 1j], dtype=torch.complex64)  # complex: XLA's own form
    torch.testing.assert_close(getattr(torch, name)(tpu(z)).cpu(), getattr(torch, name)(z))


def test_searchsorted_notes_non_contiguous_operands_once_per_process_like_cpu():
    # CPU's searchsorted warns (once per process each) when its input values,
    # boundaries or sorter are non-contiguous; bucketize does not. Each
    # device in a fresh process, so no earlier test has used up the warnings.
    code = r"""
import json, sys, warnings, torch, torch_pjrt
dev = sys.argv[1] if len(sys.argv) > 1 else "DEV"
g = torch.Generator().manual_seed(0)
b = torch.sort(torch.randn(4, 3, generator=g), dim=0)[0].t().to(dev)
v = torch.randn(4, 3, generator=g).t().to(dev)
s0 = torch.randn(3, 4, generator=g)
srt = torch.argsort(s0, dim=1).to(dev)
srt_nc = torch.stack([srt, srt], -1)[..., 0]  # (made on the device: .to() would make it contiguous)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    r = [torch.searchsorted(b, v), torch.searchsorted(b, v), torch.searchsorted(s0.to(dev), v.contiguous(), sorter=srt_nc),
         torch.bucketize(v, torch.arange(3.)[::2].to(dev))]
msgs = [str(x.message).split(" (Triggered")[0] for x in w if "searchsorted" in str(x.message)]
print("RESULT " + json.dumps({"msgs": msgs, "r": [t.cpu().tolist() for t in r]}))
"""
    cpu = run_json(code.replace('"DEV"', '"cpu"'))
    dev = run_json(code.replace('"DEV"', '"tpu"'))
    assert len(cpu["msgs"]) == 3
    assert dev == cpu


# ---- frexp, entr, zeta, gcd/lcm, renorm, logspace, tril/triu_indices, channel_shuffle ----

def test_frexp_as_cpu_with_subnormals_and_special_values(no_cpu_fallback):
    v = torch.tensor([0.0, -0.0, 1.0, -3.5, 1e-40, -1e-45, 3e38, INF, -INF, NAN, 0.75, 1024.0, 2.0 ** -126])
    for dtype in FLOAT_DTYPES:
        x = v.to(dtype)
        mc, ec = torch.frexp(x)
        mt, et = torch.frexp(tpu(x))
        assert et.dtype == torch.int32
        assert torch.equal(et.cpu(), ec)
        assert torch.equal(mt.cpu().nan_to_num(), mc.nan_to_num())
        num = ~mc.isnan()  # (a NaN's sign is not kept through conversions)
        assert torch.equal(mt.cpu().signbit()[num], mc.signbit()[num]) and torch.equal(mt.cpu().isnan(), ~num)
    with pytest.raises(RuntimeError, match="floating-point"):
        torch.frexp(tpu(torch.arange(3)))


def test_entr_and_zeta_special_values(no_cpu_fallback):
    v = torch.tensor(SPECIAL)
    assert_same(torch.special.entr(tpu(v)), torch.special.entr(v))
    assert_same(torch.special.entr(tpu(torch.arange(-2, 5))), torch.special.entr(torch.arange(-2, 5)))
    # Cephes' domain rules: x == 1 -> inf, x < 1 -> nan, integer q <= 0 -> inf,
    # non-integer x with q <= 0 -> nan.
    x = torch.tensor([1.0, 1.5, 2.0, 3.0, 0.5, 10.0, 2.0, 2.0, 4.0, 1.1, 30.0, 2.5])
    q = torch.tensor([1.0, 2.0, 0.5, -1.0, 1.0, 3.0, -2.5, 0.0, 100.0, 1e-3, 1.0, -0.5])
    for dtype in (torch.float32, torch.float64):
        assert_same(torch.special.zeta(tpu(x.to(dtype)), tpu(q.to(dtype))), torch.special.zeta(x.to(dtype), q.to(dtype)),
                    rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_gcd_lcm_as_cpu(dtype, no_cpu_fallback):
    g = torch.Generator().manual_seed(0)
    lo = 0 if dtype == torch.uint8 else -100
    a = torch.randint(lo, 100, (64,), generator=g).to(dtype)
    b = torch.randint(lo, 100, (64,), generator=g).to(dtype)
    a[:3] = 0
    b[2:5] = 0
    assert_same(torch.gcd(tpu(a), tpu(b)), torch.gcd(a, b))
    assert_same(torch.lcm(tpu(a), tpu(b)), torch.lcm(a, b))  # (int8 products wrap as CPU's)
    if dtype == torch.int64:  # consecutive Fibonacci numbers: Euclid's longest runs
        x = torch.tensor([2 ** 62, 3 * 2 ** 40, 1836311903, 2971215073])
        y = torch.tensor([2 ** 61 + 8, 2 ** 33, 1134903170, 1836311903])
        assert_same(torch.gcd(tpu(x), tpu(y)), torch.gcd(x, y))
    with pytest.raises(NotImplementedError, match="gcd_cpu"):
        torch.gcd(tpu(torch.ones(2)), tpu(torch.ones(2)))


@pytest.mark.parametrize("p", [1, 2, 3, INF, 0.5])
def test_renorm_as_cpu(p, no_cpu_fallback):
    w = make((5, 4, 3), torch.float32)
    for dim in (0, 1, -1):
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
            assert_same(torch.renorm(tpu(w.to(dtype)), p, dim, 2.0), torch.renorm(w.to(dtype), p, dim, 2.0),
                        rtol=tol, atol=tol)


def test_logspace_as_cpu(no_cpu_fallback):
    for args in [(0, 3, 5), (-2, 2, 7, 2.0), (1, 10, 1), (0.5, 3.3, 11, math.e), (2, -2, 6, 0.5), (0, 1, 0)]:
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64):
            assert_same(torch.logspace(*args, dtype=dtype, device="tpu"), torch.logspace(*args, dtype=dtype),
                        rtol=0, atol=0)


def test_tril_triu_indices_as_cpu(no_cpu_fallback):
    for r, c, o in [(4, 5, 0), (4, 5, -1), (5, 3, 2), (0, 3, 0), (3, 3, -5), (6, 4, 10), (100, 80, -3)]:
        for fn in (torch.tril_indices, torch.triu_indices):
            assert_same(fn(r, c, o, device="tpu"), fn(r, c, o))
    assert torch.tril_indices(3, 3, dtype=torch.int32, device="tpu").dtype == torch.int32


def test_channel_shuffle_as_cpu(no_cpu_fallback):
    x = make((2, 12, 3, 3), torch.float32)
    for g in (1, 2, 3, 4, 6, 12):
        assert_same(F.channel_shuffle(tpu(x), g), F.channel_shuffle(x, g))
    assert_same(torch.nn.ChannelShuffle(3)(tpu(make((1, 6, 5)))), torch.nn.ChannelShuffle(3)(make((1, 6, 5))))
    with pytest.raises(RuntimeError, match="divisible by groups"):
        F.channel_shuffle(tpu(x), 5)


def test_nonzero_static_as_cpu(no_cpu_fallback):
    g = torch.Generator().manual_seed(1)
    cases = [torch.tensor([0, 1, 0, 2, 3, 0]), torch.randint(0, 2, (3, 4, 5), generator=g), torch.tensor(5.0),
             torch.tensor(0.0), torch.zeros(0, 3), torch.tensor([[True, False], [True, True]]),
             torch.tensor([0.0, -0.0, NAN, 1e-40]), torch.tensor([0.0, 1e-40], dtype=torch.float64)]
    for x in cases:
        for size in (0, 1, 3, 70):
            for fill in (-1, 7):
                assert_same(torch.nonzero_static(tpu(x), size=size, fill_value=fill),
                            torch.nonzero_static(x, size=size, fill_value=fill))


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.float16])
def test_lgamma_near_its_zeros_and_up_to_eight(dt, no_cpu_fallback):
    """lgamma within 2 ulps of the float64 value (relative) on [0, 8), exactly
    0 at 1 and 2. CHLO's form gave lgamma(1) = 4.8e-7 and lgamma(0.9999)
    1.6% off in float32, and 11-51 ulps on [0.1, 0.5) and [2.5, 5)."""
    x = torch.cat([torch.linspace(1e-4, 8, 20000), torch.tensor([1.0, 2.0, 0.9999, 1.0001, 1.9999, 2.0001, 0.5, 1.5, 2.5])])
    x = x.to(dt)
    got = torch.lgamma(tpu(x)).cpu()
    assert torch.equal(got[-9:-7], torch.zeros(2, dtype=dt)) and not got[-9:-7].signbit().any()
    ref = torch.tensor([math.lgamma(v) for v in x.double().tolist()], dtype=torch.float64)
    err = (got.double() - ref).abs() / (ref.abs() * torch.finfo(dt).eps)
    # (the half types: the float32 result rounded once, as CPU rounds it)
    assert float(err.nan_to_num(0).max()) <= (2 if dt == torch.float32 else 1), float(x[err.argmax()])


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64])
def test_ldexp_scales_without_overflowing_the_power(dt, no_cpu_fallback):
    """ldexp of an integer exponent is self * 2^other rounded once, as CPU's
    std::ldexp: 1e-30 * 2^150 is 1.4e15, 0 * 2^200 is 0 (PyTorch's composite,
    self * pow(2, other), made inf and NaN). Integer self: CPU's self *
    pow(2.0, other), NaN at 0 * 2^200 included. (No subnormal results: XLA
    flushes them.)"""
    x = torch.tensor([1e-30, 0.0, -INF, 3.0, -2.5, 1e30, 1.0, NAN, 7.0, -0.0, 5.0]).to(dt)
    for e in ([150, 200, -200, 2, -3, -250, 40, 5, -20, 3000, 127],
              [1000, -1000, 3000, -3000, 1, 0, -1, 1100, 60, -5, -127]):
        e = torch.tensor(e)
        want, got = torch.ldexp(x, e), torch.ldexp(tpu(x), tpu(e))
        keep = want.abs() >= torch.finfo(want.dtype).tiny
        keep |= (want == 0) | want.isnan() | want.isinf()
        assert_same(got[tpu(keep)], want[keep], rtol=0, atol=0)
    y = tpu(torch.tensor([1.5, -3.0]))
    assert_same(y.ldexp_(tpu(torch.tensor([300, -2]))), torch.tensor([1.5, -3.0]).ldexp_(torch.tensor([300, -2])))


def test_ldexp_of_a_float_exponent_is_cpus_power(no_cpu_fallback):
    """A float exponent takes CPU's self * pow(2, other) (2^2.5 is not a
    power of two)."""
    x, e = torch.randn(6), torch.tensor([1.5, -2.25, 0.0, 3.0, 130.0, -0.5])
    assert_same(torch.ldexp(tpu(x), tpu(e)), torch.ldexp(x, e))


@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
def test_zeta_of_a_huge_x_is_its_first_term(dt, no_cpu_fallback):
    """zeta(x, q) past x = 1000 is q^-x, as CPU's series gives it: 1 at an
    infinite x and q = 1, inf below 1 (CHLO's was NaN from x = 3300 in
    float32 and at x = inf)."""
    x = torch.cat([torch.tensor([INF, 1e30, INF, 1e5, 1e4, 1001.0, 999.0, 1e5, 1e5]), torch.logspace(2, 4, 60)]).to(dt)
    q = torch.cat([torch.tensor([1.0, 1.0, 0.5, 1.0, 2.0, 1.3, 1.3, 0.999999, 1.000001]),
                   torch.tensor([1.0, 0.5, 2.0, 0.9, 1.5, 30.0]).repeat(10)]).to(dt)
    # (atol: a subnormal result is flushed to 0 by XLA)
    torch.testing.assert_close(torch.special.zeta(tpu(x), tpu(q)).cpu(), torch.special.zeta(x, q), rtol=1e-5,
                               atol=torch.finfo(dt).tiny, equal_nan=True)



@pytest.mark.parametrize("dt,powers", [(torch.float32, range(-37, 39)), (torch.float64, range(-307, 309))])
def test_log10_is_exact_at_powers_of_ten(dt, powers):
    # log(x) / ln 10 missed them by an ulp or more, so floor(log10(1000))
    # was 2 (digit counts); the exponent split keeps each term exact.
    x = torch.tensor([float(f"1e{k}") for k in powers], dtype=dt)
    assert torch.equal(torch.log10(tpu(x)).cpu(), torch.log10(x))
    assert torch.equal(torch.log10(tpu(x)).floor().cpu(), torch.tensor(list(powers), dtype=dt))
    special = torch.tensor([0.0, -0.0, -1.0, math.inf, math.nan, 0.5], dtype=dt)
    assert_same(torch.log10(tpu(special)), torch.log10(special))
    g = torch.Generator().manual_seed(0)
    r = torch.exp(torch.empty(4000, dtype=torch.float64).uniform_(-80, 80, generator=g)).to(dt)
    torch.testing.assert_close(torch.log10(tpu(r)).cpu(), torch.log10(r), rtol=4e-7 if dt == torch.float32 else 1e-15,
                               atol=0)


def test_division_by_a_constant_rounds_as_cpu():
    # XLA turns x / c into x * (1 / c): mean, mse_loss, round(decimals)
    # were 1 ulp off CPU in about a third of the elements.
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-50, 50, (3000, 3), generator=g).float()
    assert torch.equal(tpu(x).mean(1).cpu(), x.mean(1))
    assert torch.equal(F.mse_loss(tpu(x), tpu(x) * 0.5).cpu(), F.mse_loss(x, x * 0.5))
    for dt in (torch.float32, torch.float64):
        y = torch.empty(3000, dtype=dt).uniform_(-100, 100, generator=g)
        for d in (1, 2, 3, -1, -2):
            assert torch.equal(torch.round(tpu(y), decimals=d).cpu(), torch.round(y, decimals=d)), (dt, d)
    ties = torch.tensor([6500.0, 10500.0, -2500.0])
    assert torch.equal(torch.round(tpu(ties), decimals=-3).cpu(), torch.round(ties, decimals=-3))


def _max_ulps(got, x, fn, dt):
    ref = fn(x.double())
    r = ref.to(dt)
    spacing = (torch.nextafter(r, torch.tensor(math.inf, dtype=dt)).double() - r.double()).abs()
    ok = (ref.abs() > torch.finfo(dt).tiny) & torch.isfinite(ref)
    return ((got.cpu().double() - ref).abs() / spacing)[ok].max().item()


@pytest.mark.parametrize("dt,lo,hi,bound", [(torch.float32, 1.0, 9.1, 8), (torch.float64, 1.0, 26.0, 10)])
def test_erfc_tail_is_accurate(dt, lo, hi, bound):
    # CHLO's tail is exp(-x*x) * P(1/x): the rounding of x*x cost up to 64
    # ulps in float32 and 509 in float64 (log_ndtr, Normal's tails).
    x = torch.linspace(lo, hi, 20001, dtype=torch.float64).to(dt)
    assert _max_ulps(torch.erfc(tpu(x)), x, torch.erfc, dt) <= bound
    compiled = torch.compile(lambda v: torch.erfc(v) * 1, backend="tpu")(tpu(x))
    assert _max_ulps(compiled, x, torch.erfc, dt) <= bound


def test_erf_from_one_on_and_ndtr_tails():
    # chlo.erf was up to 5.3 ulps off on 1 <= |x| < 3.92, which ndtr's
    # 0.5 * (1 + erf(x / sqrt 2)) turned into 3x the true value at -5.3.
    x = torch.linspace(1.0, 3.95, 20001)
    assert _max_ulps(torch.erf(tpu(x)), x, torch.erf, torch.float32) <= 1.5
    assert _max_ulps(torch.erf(tpu(-x)), -x, torch.erf, torch.float32) <= 1.5
    t = torch.tensor([-5.304, -4.0, -3.0, 3.0])
    torch.testing.assert_close(torch.special.ndtr(tpu(t)).cpu(), torch.special.ndtr(t), rtol=0.1, atol=0)


def test_float64_log1p_and_atanh_near_minus_0_4():
    # XLA's float64 log1p was up to 128 ulps off on -0.5 <= x < -0.29, and
    # atanh (through it) 126 ulps at |x| near 0.414; CPU: 1.
    x = torch.linspace(-0.6, 0.6, 20001, dtype=torch.float64)
    for fn, xs in ((torch.log1p, x), (torch.atanh, x), (torch.atanh, torch.linspace(-0.999, 0.999, 20001,
                                                                                      dtype=torch.float64))):
        assert _max_ulps(fn(tpu(xs)), xs, fn, torch.float64) <= 2, fn
        compiled = torch.compile(lambda v: fn(v) * 1, backend="tpu")(tpu(xs))
        assert _max_ulps(compiled, xs, fn, torch.float64) <= 2, fn
    special = torch.tensor([-1.0, 1.0, -2.0, 2.0, 0.0, -0.0, math.nan, math.inf, -math.inf], dtype=torch.float64)
    assert_same(torch.atanh(tpu(special)), torch.atanh(special))
    assert_same(torch.log1p(tpu(special)), torch.log1p(special))


def test_float64_erfinv_tails():
    # CHLO's float64 erfinv was 5e5 ulps off at 1 - 2**-27 (Normal.icdf's
    # far tails) and 21 in the middle; one Newton step with erfc's residual.
    x = torch.cat([torch.linspace(0.5, 0.9999, 20001, dtype=torch.float64),
                   1 - torch.logspace(-15, -4, 2001, dtype=torch.float64)])
    x = torch.cat([x, -x])
    inner = x.abs() < 0.9
    got = torch.erfinv(tpu(x))
    assert _max_ulps(got[tpu(inner)], x[inner], torch.erfinv, torch.float64) <= 8
    assert _max_ulps(got[tpu(~inner)], x[~inner], torch.erfinv, torch.float64) <= 2


def test_float64_lgamma_below_8():
    # CHLO's float64 lgamma cancels near its zeros (lgamma(1 + 2^-51) was 0)
    # and was up to 223 ulps off on [1.25, 1.75): the series float32 uses,
    # with 60 terms and zeta values good to float64.
    x = torch.cat([torch.linspace(1e-6, 8.0, 40001, dtype=torch.float64)] +
                  [c + s * torch.logspace(-16, -1, 401, dtype=torch.float64) for c in (1, 2) for s in (1, -1)])
    assert _max_ulps(torch.lgamma(tpu(x)), x, torch.lgamma, torch.float64) <= 4
    assert torch.lgamma(tpu(torch.tensor([1 + 2**-51], dtype=torch.float64))).item() == pytest.approx(-2.5633524853920e-16,
                                                                                                      rel=1e-12)


@pytest.mark.parametrize("dt", [torch.float64, torch.float32])
def test_zeta_with_negative_q(dt):
    # CHLO's Hurwitz zeta sums its series from q: zeta(5, -10.3) was -2.8e22
    # (CPU -405.78). q < 1 now steps up by zeta(x, q) = zeta(x, q + 1) + q^-x.
    x = torch.tensor([5.0, 2.0, 3.0, 4.0, 2.0, 3.0, 6.0, 2.0, 2.5, 2.0, 1.0, 0.5, 3.0, 2.0], dtype=dt)
    q = torch.tensor([-10.3, -9.3, -8.3, -20.7, -0.5, 0.3, -100.25, 1.5, -3.5, -3.0, 2.0, 2.0, 5.0, 0.7], dtype=dt)
    expected = torch.special.zeta(x, q)
    rtol = 1e-13 if dt == torch.float64 else 2e-6
    torch.testing.assert_close(torch.special.zeta(tpu(x), tpu(q)).cpu(), expected, rtol=rtol, atol=0, equal_nan=True)
    compiled = torch.compile(lambda u, v: torch.special.zeta(u, v), backend="tpu")(tpu(x), tpu(q))
    torch.testing.assert_close(compiled.cpu(), expected, rtol=rtol, atol=0, equal_nan=True)
