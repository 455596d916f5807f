"""uint16/uint32/uint64 (PyTorch's "barebones" unsigned types) on tpu against
CPU: creation, copies, conversions, the bitwise ops and comparisons CPU has,
view(dtype) reinterpretation; ops CPU does not implement raise the same type."""
import pytest
import torch

import torch_pjrt
from conftest import assert_same, check_raises, tpu

UNSIGNED = [torch.uint16, torch.uint32, torch.uint64]


def data(dt, seed=0):
    g = torch.Generator().manual_seed(seed)
    hi = {torch.uint16: 2**16, torch.uint32: 2**32, torch.uint64: 2**62}[dt]
    return torch.randint(0, hi, (3, 5), generator=g, dtype=torch.int64).to(dt)


@pytest.mark.parametrize("dt", UNSIGNED)
def test_creation(dt):
    assert_same(torch.zeros(2, 3, dtype=dt, device="tpu"), torch.zeros(2, 3, dtype=dt))
    assert_same(torch.ones(4, dtype=dt, device="tpu"), torch.ones(4, dtype=dt))
    assert_same(torch.full((2, 2), 7, dtype=dt, device="tpu"), torch.full((2, 2), 7, dtype=dt))
    assert_same(torch.tensor([1, 2, 3], dtype=dt, device="tpu"), torch.tensor([1, 2, 3], dtype=dt))
    e = torch.empty(3, dtype=dt, device="tpu")
    assert e.dtype == dt and e.shape == (3,)


@pytest.mark.parametrize("dt", UNSIGNED)
def test_copies_and_conversions(dt):
    x = data(dt)
    t = tpu(x)
    assert t.dtype == dt
    assert torch.equal(t.cpu(), x)
    for other in [torch.float32, torch.int64, torch.uint8, torch.int32, torch.float64] + UNSIGNED:
        assert_same(t.to(other), x.to(other))
    f = torch.tensor([0.0, 1.5, 300.0, 65535.0])
    assert_same(tpu(f).to(dt), f.to(dt))
    assert_same(t.clone(), x.clone())
    assert_same(t[1:, ::2], x[1:, ::2])
    assert_same(torch.cat([t, t]), torch.cat([x, x]))


# Floats past int32's range: uint32 converts through int64 and uint64 as
# unsigned on CPU (3e9 -> uint32 was INT32_MIN's bits, 2147483648). Out of
# range values are C++'s undefined conversions, whose CPU results differ
# between its own kernels (scalar, vectorized): not compared.
IN_RANGE = {torch.uint32: [0.0, 1.5, -1.0, -1.5, -3e4, 2.0**31, 3e9, 4294967040.0, -2.0**31],
            torch.uint64: [0.0, 1.5, -1.0, -3e9, 3e9, 1e10, 2.0**62, 2.0**63, 1e19, 2.0**64 - 2.0**40, -2.0**63]}


@pytest.mark.parametrize("dt", [torch.uint32, torch.uint64])
@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.bfloat16])
def test_floats_beyond_int32_convert_to_unsigned_as_cpu(dt, src):
    x = torch.tensor(IN_RANGE[dt], dtype=src)
    assert_same(tpu(x).to(dt), x.to(dt))
    assert_same(torch.compile(lambda v: v.to(dt) * 1, backend="tpu")(tpu(x)), x.to(dt) * 1)
    out = torch.zeros(len(x), dtype=dt)
    assert_same(tpu(out).copy_(tpu(x)), out.copy_(x))
    assert_same(torch.full((2,), 3e9, dtype=dt, device="tpu"), torch.full((2,), 3e9, dtype=dt))
    big = 1e19 if dt == torch.uint64 else 4e9
    assert_same(tpu(torch.zeros(2, dtype=dt)).fill_(big), torch.zeros(2, dtype=dt).fill_(big))


@pytest.mark.parametrize("dt", UNSIGNED)
@pytest.mark.parametrize("op", ["and", "or", "xor", "eq", "ne", "eq_scalar", "mul", "sum", "where"])
def test_supported_ops(dt, op):
    fns = {"and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
           "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "eq_scalar": lambda a, b: a == 3,
           "mul": lambda a, b: a * b, "sum": lambda a, b: a.sum(),
           "where": lambda a, b: torch.where(a == b, a, b)}
    a, b = data(dt, 0), data(dt, 1)
    a[0, 0] = b[0, 0]
    assert_same(fns[op](tpu(a), tpu(b)), fns[op](a, b))


@pytest.mark.parametrize("dt", UNSIGNED)
@pytest.mark.parametrize("op", ["not", "shift", "add", "lt", "neg", "max", "minimum"])
def test_unsupported_ops_raise_as_cpu(dt, op):
    fns = {"not": lambda a, b: ~a, "shift": lambda a, b: a << 1, "add": lambda a, b: a + b,
           "lt": lambda a, b: a < b, "neg": lambda a, b: -a, "max": lambda a, b: a.max(),
           "minimum": lambda a, b: torch.minimum(a, b)}
    check_raises(fns[op], data(dt, 0), data(dt, 1))


@pytest.mark.parametrize("src,dst", [(torch.int16, torch.uint16), (torch.uint16, torch.int16),
                                     (torch.float32, torch.uint32), (torch.uint32, torch.float32),
                                     (torch.float32, torch.int32), (torch.int64, torch.uint64),
                                     (torch.float64, torch.uint64), (torch.float32, torch.uint16),
                                     (torch.uint16, torch.float32), (torch.uint64, torch.uint16),
                                     (torch.uint8, torch.uint16), (torch.float64, torch.uint32)])
def test_view_dtype(src, dst):
    x = torch.tensor([[1.0, -2.0, 3.5, 0.25], [7.0, -0.5, 100.0, 2.0]], dtype=torch.float64)
    x = x.to(src) if src.is_floating_point else torch.arange(-3, 5).reshape(2, 4).to(src)
    t = tpu(x)
    assert_same(t.view(dst), x.view(dst))
    # The view shares storage: a write through it is seen by the base.
    v, cv = t.view(dst), x.view(dst)
    v[0, 0] = 5
    cv[0, 0] = 5
    assert_same(t, x)


def test_view_dtype_errors_as_cpu():
    check_raises(lambda x: x.view(torch.uint32), torch.zeros(3, dtype=torch.uint16))  # last dim odd
    check_raises(lambda x: x.t().view(torch.uint16), torch.zeros(2, 3, dtype=torch.float32))


# ---- Python ints in [2**63, 2**64) (PyTorch's uint64 Scalars) ----------------------------------

BIG = [2**63, 2**63 + 5, 2**64 - 1]
BIGF = 2**63 + 2**39 + 1  # rounds differently to float32 directly than through float64


def same_exactly(got, want):
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            same_exactly(g, w)
        return
    assert got.device.type == "tpu"
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want) or (got.is_floating_point() and torch.equal(got.isnan(), want.isnan())
                                      and torch.equal(got[~got.isnan()], want[~want.isnan()])), (got, want)


def like_cpu(fn, *inputs):
    """fn on tpu copies of inputs: CPU's exact result, or CPU's exception type."""
    try:
        want = fn(*inputs)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            fn(*tpu(inputs))
        return
    same_exactly(fn(*tpu(inputs)), want)


U64_CASES = {
    "add_raises": lambda t: t + 2**63,
    "full": lambda t: torch.full((3,), 2**64 - 1, dtype=torch.uint64, device=t.device),
    "full_u32_raises": lambda t: torch.full((3,), 2**64 - 1, dtype=torch.uint32, device=t.device),
    "full_like": lambda t: torch.full_like(t, 2**63 + 1),
    "fill_": lambda t: t.clone().fill_(2**63),
    "eq": lambda t: t == 2**63 + 5,
    "ne": lambda t: t != 2**63 + 5,
    "eq_out": lambda t: torch.eq(t, 2**64 - 1, out=torch.empty(t.shape, dtype=torch.bool, device=t.device)),
    "and": lambda t: torch.bitwise_and(t, 2**64 - 1),
    "or": lambda t: t | 2**63,
    "xor": lambda t: t ^ (2**64 - 1),
    "rxor": lambda t: (2**63 + 1) ^ t,
    "and_": lambda t: t.clone().bitwise_and_(2**63 + 1),
    "mul": lambda t: t * (2**63 + 1),
    "mul_": lambda t: t.clone().mul_(2**64 - 1),
    "zero_d_and": lambda t: t & torch.tensor(2**63 + 1, dtype=torch.uint64),
    "zero_d_eq": lambda t: t == torch.tensor(2**63 + 5, dtype=torch.uint64),
    "zero_d_mul": lambda t: t * torch.tensor(2**64 - 1, dtype=torch.uint64),
    "lt_raises": lambda t: t < 2**63,
    "where_raises": lambda t: torch.where(t == 1, 2**63, 0),
    "cat": lambda t: torch.cat([t, t.clone().fill_(2**64 - 1)]),
    "sum": lambda t: (t * (2**63 + 1)).sum(),
}


@pytest.mark.parametrize("case", list(U64_CASES))
def test_uint64_python_scalars_on_uint64_tensors(case):
    like_cpu(U64_CASES[case], torch.tensor([1, *BIG], dtype=torch.uint64))


OTHER_CASES = {
    "i64_add": (torch.int64, lambda t: t + 2**63),
    "i64_mul": (torch.int64, lambda t: t * (2**64 - 1)),
    "i64_and": (torch.int64, lambda t: t & 2**63),
    "i64_eq": (torch.int64, lambda t: t == 2**63),
    "i64_rem": (torch.int64, lambda t: t % 2**63),
    "i64_zero_d_and": (torch.int64, lambda t: t & torch.tensor(2**63, dtype=torch.uint64)),
    "i64_zero_d_add": (torch.int64, lambda t: t + torch.tensor(2**64 - 1, dtype=torch.uint64)),
    # CPU converts these with an overflow check: RuntimeError.
    "i64_fill_raises": (torch.int64, lambda t: t.clone().fill_(2**63)),
    "i64_alpha_raises": (torch.int64, lambda t: torch.add(t, t, alpha=2**63)),
    "i64_masked_fill_raises": (torch.int64, lambda t: t.masked_fill(t > 0, 2**63)),
    "i64_clamp_raises": (torch.int64, lambda t: t.clamp(max=2**63)),
    "i64_full_raises": (torch.int64, lambda t: torch.full((2,), 2**63, device=t.device)),
    "i32_and": (torch.int32, lambda t: t & 2**63),
    "i32_or": (torch.int32, lambda t: t | (2**64 - 1)),
    "i32_eq": (torch.int32, lambda t: t == 2**63),
    "i32_fill_raises": (torch.int32, lambda t: t.clone().fill_(2**63)),
    "u8_and": (torch.uint8, lambda t: t & (2**64 - 1)),
    "u8_eq": (torch.uint8, lambda t: t == 2**64 - 1),
    "u32_and": (torch.uint32, lambda t: t & (2**64 - 1)),
    "u32_eq": (torch.uint32, lambda t: t == 2**64 - 1),
    "u32_fill_raises": (torch.uint32, lambda t: t.clone().fill_(2**63)),
    "u16_mul": (torch.uint16, lambda t: t * (2**63 + 1)),
    # Bool with uint64: CPU's promotion error.
    "bool_add_raises": (torch.bool, lambda t: t + 2**63),
    "bool_and_raises": (torch.bool, lambda t: t & 2**63),
    "bool_eq_raises": (torch.bool, lambda t: t == 2**63),
    "bool_zero_d_raises": (torch.bool, lambda t: t & torch.tensor(2**63, dtype=torch.uint64)),
    "bool_fill": (torch.bool, lambda t: t.clone().fill_(2**63)),
    "f32_mul": (torch.float32, lambda t: t * BIGF),
    "f32_add": (torch.float32, lambda t: t + BIGF),
    "f32_sub": (torch.float32, lambda t: t - (2**64 - 1)),
    "f32_div": (torch.float32, lambda t: t / 2**63),
    "f32_eq": (torch.float32, lambda t: t == BIGF),
    "f32_alpha": (torch.float32, lambda t: torch.add(t, t, alpha=2**63)),
    "f32_fill": (torch.float32, lambda t: t.clone().fill_(BIGF)),
    "f32_full": (torch.float32, lambda t: torch.full((3,), BIGF, dtype=torch.float32, device=t.device)),
    "f32_clamp": (torch.float32, lambda t: t.clamp(min=2**63)),
    "f32_masked_fill": (torch.float32, lambda t: t.masked_fill(t > 1, 2**64 - 1)),
    "f32_zero_d_mul": (torch.float32, lambda t: t * torch.tensor(BIGF, dtype=torch.uint64)),
    "f64_eq": (torch.float64, lambda t: t == 2**63 + 1),
    "f64_mul": (torch.float64, lambda t: t * BIGF),
    "f16_mul": (torch.float16, lambda t: t * (2**63 + 1)),
    "bf16_mul": (torch.bfloat16, lambda t: t * 2**63),
    "bf16_eq": (torch.bfloat16, lambda t: t == 2**63),
    "foreach_mul_list": (torch.float32, lambda t: torch._foreach_mul([t, t * 2], [2**63, 2**64 - 1])),
    "foreach_mul": (torch.float32, lambda t: torch._foreach_mul([t, t * 2], BIGF)),
}


@pytest.mark.parametrize("case", list(OTHER_CASES))
def test_uint64_python_scalars_on_other_dtypes(case):
    dt, fn = OTHER_CASES[case]
    if dt.is_floating_point:
        x = torch.tensor([1.0, -2.0, 2.0**63, 9.223373136366404e+18, 0.0], dtype=torch.float64).to(dt)
    elif dt == torch.bool:
        x = torch.tensor([True, False, True])
    else:
        x = torch.tensor([1, 0, 7, 2**63 - 1 if dt == torch.int64 else 100], dtype=torch.int64).to(dt)
        if dt == torch.int64:
            x[1] = -2**63
    like_cpu(fn, x)


def test_uint64_scalar_is_not_the_int64_with_its_bits():
    # -2**63 and 2**63 share their 64 bits: programs (keys) must tell them apart.
    x = torch.tensor([2.0**63, -2.0**63, 1.0])
    for v in [-2**63, 2**63, -2**63, 2**64 - 1, -1]:
        same_exactly(tpu(x) == v, x == v)
        same_exactly(tpu(x) * v, x * v)
        same_exactly(tpu(x) * torch.tensor(v, dtype=torch.uint64 if v >= 2**63 else torch.int64),
                     x * torch.tensor(v, dtype=torch.uint64 if v >= 2**63 else torch.int64))


def test_uint64_python_scalars_in_compiled_graphs():
    torch._dynamo.reset()
    try:
        def f(x, y):
            return (x * 2**63, x == 2**63 + 5, x & (2**64 - 1), x.clone().fill_(2**64 - 1),
                    y * BIGF, torch.add(y, y, alpha=2**63), y == 2**63, y.masked_fill(y > 1, 2**64 - 1))
        x = torch.tensor([1, *BIG], dtype=torch.uint64)
        y = torch.tensor([1.0, 2.0, 9.223373136366404e+18, 2.0**63])
        before = torch_pjrt.metrics()
        got = torch.compile(f, backend="tpu")(*tpu((x, y)))
        after = torch_pjrt.metrics()
        same_exactly(got, f(x, y))
        assert after["compiled_graphs"] > before["compiled_graphs"]
        assert after["eager_graph_fallbacks"] == before["eager_graph_fallbacks"]
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("alpha", [2**63, 2**63 + 1, 2**64 - 1])
@pytest.mark.parametrize("dt", [torch.int64, torch.float32, torch.float64])
def test_sub_with_uint64_alpha_like_cpu(alpha, dt):
    # CPU subtracts as an add of -alpha and negates a uint64 Scalar as the int64
    # of its bits: sub(x, y, alpha=2**64 - 1) is x + y there, and no overflow
    # error for int64 (add(..., alpha=2**63) raises one).
    x = torch.tensor([1, 3, -2], dtype=dt)
    for fn in [lambda t: torch.sub(t, t * 2, alpha=alpha), lambda t: torch.rsub(t, t * 2, alpha=alpha),
               lambda t: torch.sub(t, 2, alpha=alpha), lambda t: torch.rsub(t, 5, alpha=alpha),
               lambda t: t.clone().sub_(t, alpha=alpha), lambda t: torch.add(t, t * 2, alpha=alpha)]:
        like_cpu(fn, x)
