"""float8 tensors on tpu: conversions bit for bit as PyTorch's CPU makes them,
data movement lowered, other ops as CPU allows them (its kernels, or its
NotImplementedError), and _scaled_mm (the FP8 matrix product) lowered."""
import pytest
import torch

import torch_pjrt  # noqa: F401
from conftest import assert_same, tpu

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
OTHERS = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]
# Overflow, rounding ties, subnormals, infinities and NaNs of every float8 type.
SPECIAL = [0., -0., 1., 0.1, 1 / 3, 240., 241., 247.9, 248., 448., 449., 463.9, 464., 464.1, 480., 500., 57344.,
           61439., 61440., 61441., 65536., 1e6, 2 ** -9, 2 ** -10, 2 ** -16, 2 ** -17, 3 * 2 ** -17, 2 ** -18,
           2 ** -20, 1e-30, float("inf"), float("nan")]


def all_float8_values(dtype):
    return torch.arange(256, dtype=torch.uint8).view(dtype)


def raw(t):
    """Bits to compare: a float8 tensor's bytes; other dtypes as they are."""
    return t.view(torch.uint8) if t.dtype in FLOAT8 else t


def assert_bits(actual, expected):
    assert actual.device.type == "tpu" and actual.dtype == expected.dtype and actual.shape == expected.shape
    a, e = raw(actual.cpu()), raw(expected)
    if a.is_floating_point():  # wider float results: NaN where CPU has NaN, every other bit equal
        assert torch.equal(a.isnan(), e.isnan())
        a, e = a.nan_to_num(0), e.nan_to_num(0)
        assert torch.equal(a.signbit(), e.signbit())
    assert torch.equal(a, e), (a, e)


def assert_values(actual, expected):
    """As assert_bits, but any NaN equals any NaN: XLA's CPU backend moves
    float8 data through a wider type, which keeps values and signed zeros but
    not a NaN's payload or sign."""
    assert actual.device.type == "tpu" and actual.dtype == expected.dtype and actual.shape == expected.shape
    a, e = actual.cpu().float(), expected.float()
    assert torch.equal(a.isnan(), e.isnan())
    assert torch.equal(a.nan_to_num(0).view(torch.int32), e.nan_to_num(0).view(torch.int32))


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
@pytest.mark.parametrize("to", OTHERS + FLOAT8, ids=str)
def test_from_float8_every_value_as_cpu(dtype, to):
    x = all_float8_values(dtype)
    assert_bits(tpu(x).to(to), x.to(to))


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
@pytest.mark.parametrize("src", OTHERS, ids=str)
def test_to_float8_as_cpu(dtype, src):
    # CPU's rules: e4m3fn saturates finite and infinite overflow to +-448, the
    # fnuz types make it NaN, e5m2 infinity; double and integers round to float first.
    g = torch.Generator().manual_seed(0)
    v = torch.tensor(SPECIAL + [-s for s in SPECIAL], dtype=torch.float64)
    v = torch.cat([v, torch.cat([torch.randn(500, generator=g, dtype=torch.float64) * s
                                 for s in (1e-4, 1, 30, 300, 1e4)])])
    x = v.to(src) if src.is_floating_point else v.nan_to_num(0, 0, 0).clamp(-1e6, 1e6).to(src)
    assert_bits(tpu(x).to(dtype), x.to(dtype))


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_data_movement_is_lowered(dtype, no_cpu_fallback):
    x = all_float8_values(dtype).reshape(16, 16)
    idx = torch.tensor([3, 0, 15, 7])
    cases = [
        lambda t, i: t.clone(),
        lambda t, i: t.t().contiguous(),
        lambda t, i: t[1::3, 2:9].contiguous(),
        lambda t, i: torch.cat([t, t[:3]]),
        lambda t, i: torch.stack([t, t.flip(0)]),
        lambda t, i: t.index_select(1, i),
        lambda t, i: t[i],
        lambda t, i: t.clone().index_put_((i,), t[:4]),
        lambda t, i: torch.where(torch.arange(16, device=t.device) % 3 == 0, t, t.t()),
        lambda t, i: torch.full((3, 2), -2.7, dtype=t.dtype, device=t.device),
        lambda t, i: t.clone().fill_(0.3),
        lambda t, i: t.clone().zero_(),
        lambda t, i: torch.empty(16, 16, dtype=t.dtype, device=t.device).copy_(t),
        lambda t, i: t.roll(3, 1),
        lambda t, i: torch.nn.functional.pad(t, (1, 2)),
    ]
    for case in cases:
        assert_values(case(tpu(x), tpu(idx)), case(x, idx))
    for case in (lambda t: t == t.t(), lambda t: t != t, lambda t: t.isnan()):
        assert_bits(case(tpu(x)), case(x))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_other_ops_as_cpu_allows_them(dtype):
    x = all_float8_values(dtype).reshape(16, 16)
    for case in (lambda t: t * t, lambda t: t.abs(), lambda t: t[:4] @ t[:, :4]):
        assert_values(case(tpu(x)), case(x))
    for case in (lambda t: t + t, lambda t: t.sum(), lambda t: -t, lambda t: t.sort()):
        with pytest.raises(NotImplementedError) as cpu_err:
            case(x)
        with pytest.raises(NotImplementedError, match=str(cpu_err.value).split(" not implemented")[0]):
            case(tpu(x))


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
@pytest.mark.parametrize("value", [448.0, 449.0, 240.0, 57344.0, 61440.0, float("inf"), float("nan")])
def test_fill_value_checked_as_cpu(dtype, value):
    try:
        want = torch.zeros(3, dtype=dtype).fill_(value)
    except RuntimeError as e:
        with pytest.raises(RuntimeError, match="value cannot be converted to type c10::Float8"):
            torch.zeros(3, dtype=dtype, device="tpu").fill_(value).cpu()
        assert "without overflow" in str(e)
        return
    assert_values(torch.zeros(3, dtype=dtype, device="tpu").fill_(value), want)


# ---- _scaled_mm ---------------------------------------------------------------------------

def operands(fa=torch.float8_e4m3fn, fb=torch.float8_e4m3fn, m=32, k=64, n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g).to(fa), torch.randn(n, k, generator=g).to(fb).t())


def assert_close_to_cpu(actual, expected):
    # float32 products: the same float32 math, summed in another order; a
    # float8 result may round to the neighbouring value (1 ulp: 2^-3 relative
    # with e4m3's 3 mantissa bits, 2^-2 with e5m2's 2).
    rel = {torch.float8_e4m3fn: 2 ** -3, torch.float8_e5m2: 2 ** -2}.get(expected.dtype, 1e-5)
    assert actual.device.type == "tpu" and actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu().float(), expected.float(), rtol=rel, atol=1e-5)


@pytest.mark.parametrize("fa,fb", [(torch.float8_e4m3fn, torch.float8_e4m3fn),
                                   (torch.float8_e4m3fn, torch.float8_e5m2),
                                   (torch.float8_e5m2, torch.float8_e4m3fn)], ids=str)
@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn],
                         ids=str)
def test_scaled_mm_tensorwise(fa, fb, out_dtype, no_cpu_fallback):
    a, b = operands(fa, fb)
    sa, sb = torch.tensor(0.5), torch.tensor(3.0)
    want = torch._scaled_mm(a, b, sa, sb, out_dtype=out_dtype)
    assert_close_to_cpu(torch._scaled_mm(*tpu((a, b, sa, sb)), out_dtype=out_dtype), want)


def test_scaled_mm_rowwise_bias_and_scale_result(no_cpu_fallback):
    a, b = operands()
    g = torch.Generator().manual_seed(1)
    ra, rb = torch.rand(32, 1, generator=g) + 0.5, torch.rand(1, 48, generator=g) + 0.5
    want = torch._scaled_mm(a, b, ra, rb, out_dtype=torch.float32)
    assert_close_to_cpu(torch._scaled_mm(*tpu((a, b, ra, rb)), out_dtype=torch.float32), want)
    sa, sb, bias = torch.tensor(0.5), torch.tensor(2.0), torch.randn(48, generator=g).bfloat16()
    want = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
    assert_close_to_cpu(torch._scaled_mm(*tpu((a, b, sa, sb)), bias=tpu(bias), out_dtype=torch.bfloat16), want)
    res = torch.tensor(4.0)
    want = torch._scaled_mm(a, b, sa, sb, scale_result=res, out_dtype=torch.float8_e4m3fn)
    assert_close_to_cpu(torch._scaled_mm(*tpu((a, b, sa, sb)), scale_result=tpu(res),
                                         out_dtype=torch.float8_e4m3fn), want)


def test_scaled_mm_shape_mismatch_raises_as_cpu():
    a, b = operands(m=32, k=64, n=48)
    one = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(32x32 and 64x48\)"):
        torch._scaled_mm(a[:, :32], b, one, one)
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(32x32 and 64x48\)"):
        torch._scaled_mm(*tpu((a[:, :32], b, one, one))).cpu()


def float8_linear(x, w):
    """torchao's tensorwise float8 linear: dynamic scales from the amax, the
    operands cast to float8_e4m3fn, one _scaled_mm to bfloat16."""
    sx = 448.0 / x.abs().max().clamp(min=1e-12).float()
    sw = 448.0 / w.abs().max().clamp(min=1e-12).float()
    x8 = (x * sx).clamp(-448, 448).to(torch.float8_e4m3fn)
    w8 = (w * sw).clamp(-448, 448).to(torch.float8_e4m3fn)
    return torch._scaled_mm(x8, w8.t(), sx.reciprocal(), sw.reciprocal(), out_dtype=torch.bfloat16)


def test_float8_linear_eager_and_compiled_as_cpu(no_cpu_fallback):
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(32, 64, generator=g), torch.randn(48, 64, generator=g)
    want = float8_linear(x, w)
    assert_same(float8_linear(tpu(x), tpu(w)), want, rtol=1e-2, atol=1e-2)
    assert_same(torch.compile(float8_linear, backend="tpu")(tpu(x), tpu(w)), want, rtol=1e-2, atol=1e-2)
    # against the float32 product: float8's error, not ours
    assert (want.float() - x @ w.t()).abs().max() < 2.0


@pytest.mark.parametrize("recipe", ["TensorWise", "RowWise"])
def test_functional_scaled_mm_v2_as_cpu(recipe, no_cpu_fallback):
    import torch.nn.functional as F
    rec = getattr(F.ScalingType, recipe)
    a, b = operands()
    g = torch.Generator().manual_seed(4)
    if recipe == "TensorWise":
        sa, sb = torch.tensor(0.5), torch.tensor(2.0)
    else:
        sa, sb = torch.rand(32, 1, generator=g) + 0.5, torch.rand(1, 48, generator=g) + 0.5
    bias = torch.randn(48, generator=g).bfloat16()
    want = F.scaled_mm(a, b, sa, rec, sb, rec, output_dtype=torch.bfloat16, bias=bias)
    got = F.scaled_mm(tpu(a), tpu(b), tpu(sa), rec, tpu(sb), rec, output_dtype=torch.bfloat16, bias=tpu(bias))
    assert_close_to_cpu(got, want)


def test_scaled_mm_out_and_scale_result_as_cpu(no_cpu_fallback):
    a, b = operands()
    sa, sb, res = torch.tensor(0.5), torch.tensor(2.0), torch.tensor(2.0)
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
        want = torch._scaled_mm(a, b, sa, sb, out=torch.empty(0, dtype=dtype))
        out = torch.empty(0, dtype=dtype, device="tpu")
        got = torch._scaled_mm(*tpu((a, b, sa, sb)), out=out)
        assert got is out
        assert_close_to_cpu(out, want)
    with pytest.raises(ValueError, match="out_dtype must match output matrix type"):
        torch._scaled_mm(*tpu((a, b, sa, sb)), out_dtype=torch.float32, out=torch.empty(0, device="tpu").bfloat16())
    # CPU applies scale_result only for a float8 out_dtype given explicitly.
    for kw in ({}, {"out_dtype": torch.float8_e4m3fn}, {"out_dtype": torch.float32}):
        want = torch._scaled_mm(a, b, sa, sb, scale_result=res, **kw)
        assert_close_to_cpu(torch._scaled_mm(*tpu((a, b, sa, sb)), scale_result=tpu(res), **kw), want)


def test_index_put_accumulate_saturates_as_cpu():
    x = torch.tensor([448.0]).to(torch.float8_e4m3fn)
    idx = (torch.tensor([0, 0]),)
    v = torch.tensor([448.0, 448.0]).to(torch.float8_e4m3fn)
    want = x.clone().index_put_(idx, v, accumulate=True)
    assert_bits(tpu(x).index_put_(tpu(idx), tpu(v), accumulate=True), want)


def test_compiled_float8_arithmetic_rounds_once_with_saturation():
    # Under torch.compile float8 arithmetic is lowered (as Inductor compiles it
    # on CPU): computed in float32, rounded once by PyTorch's conversion, so an
    # overflow saturates to +-448 as CPU's mul does, not NaN.
    x = torch.tensor([100.0, 300.0, -448.0, 2.0, float("nan")]).to(torch.float8_e4m3fn)
    mul = torch.compile(lambda a: a * a, backend="tpu")
    add = torch.compile(lambda a: a + a, backend="tpu")
    assert_bits(mul(tpu(x)), x * x)
    assert_bits(add(tpu(x)), (x.float() + x.float()).to(torch.float8_e4m3fn))
