"""Elementwise unary, comparison, logical, bitwise and min/max ops vs PyTorch on CPU."""
import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, INT_DTYPES, assert_same, check_raises, make, tpu

SHAPES = [(), (0,), (3, 4)]
SIGNED_INTS = [d for d in INT_DTYPES if d != torch.uint8]

# name -> (function, low, high): the input range keeps values in the domain.
FLOAT_UNARY = {
    "exp": (torch.exp, -3, 3),
    "log": (torch.log, 0.1, 5),
    "sqrt": (torch.sqrt, 0, 5),
    "rsqrt": (torch.rsqrt, 0.1, 5),
    "tanh": (torch.tanh, -3, 3),
    "sigmoid": (torch.sigmoid, -5, 5),
    "erf": (torch.erf, -3, 3),
    "gelu": (F.gelu, -4, 4),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), -4, 4),
    "silu": (F.silu, -4, 4),
    "relu": (torch.relu, -3, 3),
    "abs": (torch.abs, -3, 3),
    "neg": (torch.neg, -3, 3),
    "sign": (torch.sign, -3, 3),
    "reciprocal": (torch.reciprocal, 0.2, 3),
    "ceil": (torch.ceil, -3, 3),
    "floor": (torch.floor, -3, 3),
    "round": (torch.round, -3, 3),
    "trunc": (torch.trunc, -3, 3),
    "tan": (torch.tan, -1.2, 1.2),
    "round_decimals": (lambda x: torch.round(x, decimals=1), -3, 3),
    "log1p": (torch.log1p, -0.9, 3),
    "expm1": (torch.expm1, -3, 3),
    "sin": (torch.sin, -3, 3),
    "cos": (torch.cos, -3, 3),
    "isfinite": (torch.isfinite, -3, 3),
    "isnan": (torch.isnan, -3, 3),
    "isinf": (torch.isinf, -3, 3),
    "square": (lambda x: x ** 2, -3, 3),
    "pow_scalar": (lambda x: torch.pow(x, 1.7), 0.1, 3),
    "scalar_pow": (lambda x: torch.pow(2.5, x), -3, 3),
    "clamp": (lambda x: x.clamp(-1, 1.5), -3, 3),
    "clamp_min": (lambda x: x.clamp(min=0.5), -3, 3),
    "clamp_max": (lambda x: x.clamp(max=0.5), -3, 3),
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", list(FLOAT_UNARY))
def test_float_unary(name, dtype, shape):
    fn, low, high = FLOAT_UNARY[name]
    x = make(shape, dtype, low=low, high=high)
    assert_same(fn(tpu(x)), fn(x))


# Integer inputs: float functions promote to float32, abs/neg/sign keep the dtype.
INT_UNARY = ["exp", "log", "sqrt", "tanh", "sigmoid", "erf", "reciprocal", "sin", "abs", "neg",
             "sign", "ceil", "floor", "round", "trunc", "isfinite", "isnan", "isinf", "relu", "square",
             "clamp", "clamp_min"]


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64, torch.uint8])
@pytest.mark.parametrize("name", INT_UNARY)
def test_int_unary(name, dtype):
    fn = FLOAT_UNARY[name][0]
    x = make((3, 4), dtype, low=-3, high=3)
    assert_same(fn(tpu(x)), fn(x))


def test_special_values():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1.0, -2.5, 2.5])
    for fn in [torch.sign, torch.relu, torch.isfinite, torch.isnan, torch.isinf, torch.abs,
               torch.round, torch.exp, torch.sigmoid, lambda a: a.clamp(-1, 1),
               lambda a: torch.maximum(a, torch.zeros((), device=a.device)),
               lambda a: torch.minimum(torch.zeros((), device=a.device), a)]:
        assert_same(fn(tpu(x)), fn(x))


@pytest.mark.parametrize("name", ["exp", "gelu", "sign", "clamp", "isnan", "round"])
def test_unary_noncontiguous(name):
    fn = FLOAT_UNARY[name][0]
    x = make((3, 4), noncontiguous=True)
    assert_same(fn(tpu(x)), fn(x))


@pytest.mark.parametrize("method", ["exp_", "neg_", "sigmoid_", "relu_", "floor_", "abs_"])
def test_inplace_on_view(method):
    base = make((4, 6))
    tbase = tpu(base)
    getattr(base[1:3, ::2], method)()
    getattr(tbase[1:3, ::2], method)()
    assert_same(tbase, base)


def test_inplace_clamp_and_masked_fill():
    base, tbase = make((4, 5)), tpu(make((4, 5)))
    base[:, 1:].clamp_(-1, 1)
    tbase[:, 1:].clamp_(-1, 1)
    base.masked_fill_(base > 0.5, 7.0)
    tbase.masked_fill_(tbase > 0.5, 7.0)
    assert_same(tbase, base)


def test_out():
    x, y = make((3, 4)), make((3, 4), seed=1)
    o, to = torch.empty(3, 4), tpu(torch.empty(3, 4))
    torch.exp(x, out=o)
    torch.exp(tpu(x), out=to)
    assert_same(to, o)
    ob, tob = torch.empty(3, 4, dtype=torch.bool), tpu(torch.empty(3, 4, dtype=torch.bool))
    torch.lt(x, y, out=ob)
    torch.lt(tpu(x), tpu(y), out=tob)
    assert_same(tob, ob)


# Binary ops over dtype pairs, including mixed ones that promote.
COMPARISONS = [torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge]
DTYPE_PAIRS = [(torch.float32, torch.float32), (torch.float64, torch.float64),
               (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
               (torch.int32, torch.int32), (torch.int64, torch.float32), (torch.uint8, torch.int8),
               (torch.float16, torch.float32), (torch.bool, torch.bool)]
BINARY = {
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
}


@pytest.mark.parametrize("dtypes", DTYPE_PAIRS, ids=lambda p: f"{p[0]}-{p[1]}".replace("torch.", ""))
@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name, dtypes):
    fn = BINARY[name]
    # Few distinct integer values so that equal elements occur.
    a, b = make((3, 4), dtypes[0], low=-2, high=2), make((3, 4), dtypes[1], low=-2, high=2, seed=1)
    if dtypes[0].is_floating_point:
        a, b = a.round(), b.round()
    assert_same(fn(tpu(a), tpu(b)), fn(a, b))


@pytest.mark.parametrize("name", ["lt", "eq", "maximum", "logical_or", "pow", "where", "clamp", "bitwise_xor"])
@pytest.mark.parametrize("shape", [(), (0,)])
def test_binary_small_shapes(name, shape):
    a, b = make(shape, low=0.1), make(shape, low=0.1, seed=1)
    fns = {"pow": torch.pow, "where": lambda x, y: torch.where(x > 1, x, y),
           "clamp": lambda x, y: x.clamp(min=y), **BINARY,
           "bitwise_xor": lambda x, y: torch.bitwise_xor(x > 1, y > 1)}
    assert_same(fns[name](tpu(a), tpu(b)), fns[name](a, b))


@pytest.mark.parametrize("name", ["lt", "ge", "maximum", "logical_and", "pow", "bitwise_or", "where"])
def test_binary_broadcast(name):
    a, b = make((3, 1), low=0.1), make((1, 4), low=0.1, seed=1)
    fns = {"pow": torch.pow, "where": lambda x, y: torch.where(x > y, x, y), **BINARY,
           "bitwise_or": lambda x, y: torch.bitwise_or(x.to(torch.int32), y.to(torch.int32))}
    assert_same(fns[name](tpu(a), tpu(b)), fns[name](a, b))


def test_binary_noncontiguous():
    a, b = make((3, 4), noncontiguous=True), make((3, 4), seed=1, noncontiguous=True)
    for fn in [torch.lt, torch.maximum, torch.pow]:
        assert_same(fn(tpu(a), tpu(b.abs())), fn(a, b.abs()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64, torch.uint8, torch.float16])
def test_scalar_operands(dtype):
    x = make((3, 4), dtype, low=-3, high=3)
    t = tpu(x)
    for fn in [lambda a: a < 2, lambda a: 2 < a, lambda a: a == 1, lambda a: a != 1.5,
               lambda a: a >= 0.5, lambda a: a <= -1, lambda a: a > 1,
               lambda a: torch.pow(a, 2), lambda a: torch.pow(a, 0.5), lambda a: torch.pow(2, a),
               lambda a: a.clamp(min=0.5), lambda a: torch.where(a > 0, a, 2),
               lambda a: torch.where(a > 0, 1.5, a), lambda a: a.masked_fill(a > 1, 9)]:
        assert_same(fn(t), fn(x))


def test_zero_dim_tensor_operand():
    # A 0-d tensor does not promote a dimensioned one of the same category.
    x, s = make((3, 4), torch.float16), torch.tensor(0.5, dtype=torch.float64)
    for fn in [torch.lt, torch.maximum, torch.pow, lambda a, b: a.clamp(max=b)]:
        assert_same(fn(tpu(x), tpu(s)), fn(x, s))


@pytest.mark.parametrize("dtype", INT_DTYPES + [torch.bool])
def test_bitwise(dtype):
    a, b = make((3, 4), dtype, low=-50, high=50), make((3, 4), dtype, low=-50, high=50, seed=1)
    ta, tb = tpu(a), tpu(b)
    for fn in [torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor, lambda x, y: torch.bitwise_not(x),
               lambda x, y: x & y, lambda x, y: x | 3 if dtype != torch.bool else x | True,
               lambda x, y: torch.logical_not(x), lambda x, y: torch.logical_and(x, y)]:
        assert_same(fn(ta, tb), fn(a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
def test_logical_mixed(dtype):
    a, b = make((3, 4), dtype, low=-1, high=1), make((3, 4), torch.bool, seed=1)
    for fn in [torch.logical_and, torch.logical_or, torch.logical_xor, lambda x, y: torch.logical_not(x)]:
        assert_same(fn(tpu(a), tpu(b)), fn(a, b))


@pytest.mark.parametrize("dtypes", [(torch.int32, torch.int32), (torch.int64, torch.int64),
                                    (torch.int32, torch.float32), (torch.float64, torch.int8)])
def test_pow_tensor_tensor(dtypes):
    a = make((3, 4), dtypes[0], low=-3, high=3)
    e = make((3, 4), dtypes[1], low=-3 if dtypes[1].is_floating_point else 0, high=3, seed=1)
    if dtypes[1].is_floating_point:
        e = e.round()  # negative float bases need integral exponents
    assert_same(torch.pow(tpu(a), tpu(e)), torch.pow(a, e))


def test_pow_int_negative_exponent():
    a = torch.tensor([-3, -1, 1, 2, 0, -1, 1], dtype=torch.int32)
    e = torch.tensor([-1, -3, -2, -2, 2, -2, 0], dtype=torch.int32)
    assert_same(torch.pow(tpu(a), tpu(e)), torch.pow(a, e))
    with pytest.raises(RuntimeError):
        torch.pow(tpu(a), -2)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_pow_int_large_exponents_wrap_like_cpu(dtype):
    # CPU squares and multiplies over every bit of the exponent, wrapping on
    # overflow: 0 ** 64 == 0, 2 ** 65 wraps to 0, uint8 3 ** 255 == 171. Exact.
    info = torch.iinfo(dtype)
    exps = [e for e in [0, 1, 2, 3, 5, 31, 63, 64, 65, 70, 100, 127, 128, 255, 1000, 2**31 - 1, 2**40 + 3, 2**62 + 1]
            if e <= info.max]
    bases = torch.tensor([v for v in [0, 1, -1, 2, -2, 3, -3, 7, 255, 2**20 + 1] if info.min <= v <= info.max],
                         dtype=dtype)
    for e in exps:
        assert_same(tpu(bases) ** e, bases ** e)
    ee = torch.tensor(exps, dtype=dtype)
    b2, e2 = bases[:, None].expand(-1, len(exps)), ee[None, :].expand(len(bases), -1)
    assert_same(torch.pow(tpu(b2), tpu(e2)), torch.pow(b2, e2))
    assert_same(torch.pow(0, tpu(ee)), torch.pow(0, ee))
    assert_same(torch.pow(3, tpu(ee)), torch.pow(3, ee))
    if dtype != torch.uint8:  # negative tensor exponents: 1, +-1 for base -1, else 0
        neg = torch.tensor([-1, -2, -3, -64, -65, info.min], dtype=dtype)
        b3, e3 = bases[:, None].expand(-1, len(neg)), neg[None, :].expand(len(bases), -1)
        assert_same(torch.pow(tpu(b3), tpu(e3)), torch.pow(b3, e3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int32])
def test_clamp_tensor_bounds(dtype):
    x = make((3, 4), dtype)
    lo, hi = make((3, 1), dtype, low=-2, high=0, seed=1), make((1, 4), dtype, low=0, high=2, seed=2)
    for fn in [lambda a, l, h: a.clamp(l, h), lambda a, l, h: a.clamp(min=l),
               lambda a, l, h: a.clamp(max=h), lambda a, l, h: torch.clamp_min(a, l),
               lambda a, l, h: torch.clamp_max(a, h), lambda a, l, h: a.clamp(h, l)]:  # min > max
        assert_same(fn(tpu(x), tpu(lo), tpu(hi)), fn(x, lo, hi))


def test_clamp_int_with_float_bounds():
    x = make((3, 4), torch.int32)
    assert_same(tpu(x).clamp(-1.5, 1.5), x.clamp(-1.5, 1.5))


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float16, torch.float32),
                                    (torch.int32, torch.int64), (torch.bool, torch.bool),
                                    (torch.int64, torch.float64)])
def test_where(dtypes):
    c = make((3, 1), torch.bool)
    a, b = make((1, 4), dtypes[0]), make((3, 4), dtypes[1], seed=1)
    assert_same(torch.where(tpu(c), tpu(a), tpu(b)), torch.where(c, a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_masked_fill(dtype):
    x, m = make((3, 4), dtype), make((1, 4), torch.bool, seed=1)
    assert_same(tpu(x).masked_fill(tpu(m), 1), x.masked_fill(m, 1))
    v = torch.tensor(0, dtype=dtype)
    assert_same(tpu(x).masked_fill(tpu(m), tpu(v)), x.masked_fill(m, v))


def test_shape_mismatch_raises():
    a, b = make((3, 4)), make((2, 4))
    for fn in [torch.lt, torch.maximum, torch.logical_and, torch.pow,
               lambda x, y: torch.where(x > 0, x, y), lambda x, y: x.masked_fill(y > 0, 1.0)]:
        with pytest.raises(RuntimeError):
            fn(a, b)
        with pytest.raises(RuntimeError):
            fn(tpu(a), tpu(b))


def test_invalid_dtype_raises_like_cpu():
    f, bo = make((3,)), make((3,), torch.bool)
    for fn in [lambda: torch.bitwise_and(f, f), lambda: torch.neg(bo)]:
        with pytest.raises(RuntimeError):
            fn()
    for fn in [lambda: torch.bitwise_and(tpu(f), tpu(f)), lambda: torch.neg(tpu(bo))]:
        with pytest.raises(RuntimeError):
            fn()


@pytest.mark.parametrize("data", [
    [[1.5, -2.25, 3.0], [0.0, 1e-3, 12345.678]],
    [1.0, 2.0, 3.0],
    [float("nan"), float("inf"), -float("inf"), 0.5],
    2.5,
    [],
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_print(data, dtype):
    x = torch.tensor(data, dtype=dtype)
    expected = str(x)
    got = str(tpu(x))
    assert "device='tpu:0'" in got
    # The longer last line may wrap differently: compare up to whitespace.
    assert got.replace(", device='tpu:0'", "").split() == expected.split()


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.uint8])
def test_print_int(dtype):
    x = make((2, 3), dtype)
    assert str(tpu(x)).replace(", device='tpu:0'", "") == str(x)


@pytest.mark.parametrize("eps", [None, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logit_and_grad(eps, dtype):
    from conftest import check
    low, high = (-0.2, 1.2) if dtype == torch.float32 else (0.05, 0.95)  # NaN outside [0, 1] without eps
    check(lambda x: torch.logit(x, eps), make((4, 5), dtype, low=low, high=high))


@pytest.mark.parametrize("eps", [None, 1e-6, 1e-3, 0.1, 0.25])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_logit_in_half_types_rounds_as_cpu(eps, dtype):
    # CPU takes eps and 1 - eps in the type (1 - 1e-6 is 1 in float16, so
    # logit(2.0, 1e-6) is inf) and rounds 1 - x and the quotient to it: equal
    # bit for bit, edges (0, 1, outside [0, 1], NaN, infinities) included.
    g = torch.Generator().manual_seed(3)
    edges = [2.0, 1.0, 0.9999, 0.999, 0.75, 0.5, 0.3, 0.001, 1e-7, 0.0, -1.0, float("nan"), float("inf"), -float("inf")]
    x = torch.cat([torch.tensor(edges), torch.rand(100, generator=g)]).to(dtype)
    assert_same(torch.logit(tpu(x), eps), torch.logit(x, eps), rtol=0, atol=0)


@pytest.mark.parametrize("eps", [0.6, 0.9, 1.0, 1.5, -0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_logit_with_eps_outside_the_usual_range_as_cpu(eps, dtype):
    # CPU clamps as x < eps ? eps : (x > 1 - eps ? 1 - eps : x): with eps above
    # 0.5 the bounds cross, and x below eps becomes eps (min/max gave 1 - eps
    # everywhere). A negative eps leaves [0, 1] alone.
    x = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.9, 0.0, 1.0, 2.0, -1.0, float("nan")], dtype=dtype)
    assert_same(torch.logit(tpu(x), eps), torch.logit(x, eps))


@pytest.mark.parametrize("eps", [None, 1e-6, 1e-3, 0.1, 0.25])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_logit_backward_in_half_types_rounds_as_cpu(eps, dtype):
    # As the forward: bounds in the type (x = 1 is inside [eps, 1 - eps] in
    # float16 for eps = 1e-6, its gradient inf), each result rounded to it.
    # (A NaN input is left out: CPU's vectorized loop gives 0 there, its
    # scalar loop and CUDA NaN, as tpu does.)
    g = torch.Generator().manual_seed(4)
    edges = [2.0, 1.0, 0.9999, 0.999, 0.75, 0.5, 0.3, 0.001, 1e-7, 0.0, -1.0, float("inf"), -float("inf")]
    x = torch.cat([torch.tensor(edges), torch.rand(100, generator=g)]).to(dtype)
    dy = torch.randn(x.shape, generator=g).to(dtype)
    expected = torch.ops.aten.logit_backward(dy, x, eps)
    assert_same(torch.ops.aten.logit_backward(tpu(dy), tpu(x), eps), expected, rtol=0, atol=0)


@pytest.mark.parametrize("invert", [False, True])
@pytest.mark.parametrize("dtypes", [(torch.int64, torch.int64), (torch.float32, torch.int64),
                                    (torch.int32, torch.float64), (torch.bfloat16, torch.float32)])
def test_isin(dtypes, invert, no_cpu_fallback):
    g = torch.Generator().manual_seed(0)
    e = torch.randint(0, 10, (4, 6), generator=g).to(dtypes[0])
    t = torch.tensor([1, 3, 5, 50]).to(dtypes[1])
    assert_same(torch.isin(tpu(e), tpu(t), invert=invert), torch.isin(e, t, invert=invert))
    assert_same(torch.isin(tpu(e), 3, invert=invert), torch.isin(e, 3, invert=invert))
    assert_same(torch.isin(3, tpu(t), invert=invert), torch.isin(3, t, invert=invert))
    empty = torch.tensor([], dtype=dtypes[1])
    assert_same(torch.isin(tpu(e), tpu(empty), invert=invert), torch.isin(e, empty, invert=invert))
    assert_same(torch.isin(tpu(empty), tpu(t), invert=invert), torch.isin(empty, t, invert=invert))


def test_isin_nan_and_eos_check(no_cpu_fallback):
    nan = float("nan")
    e, t = torch.tensor([nan, 1.0, 2.0]), torch.tensor([nan, 2.0])
    assert_same(torch.isin(tpu(e), tpu(t)), torch.isin(e, t))
    # generate()'s stopping check: last tokens against the end-of-sequence ids.
    tokens, eos = torch.tensor([[5, 2], [7, 0]]), torch.tensor([0, 2])
    assert_same(torch.isin(tpu(tokens)[:, -1], tpu(eos)), torch.isin(tokens[:, -1], eos))


def test_bool_times_inf_and_nan_is_nan_where_false():
    # False * inf is 0 * inf = nan on CPU; False * -2 is -0.0.
    m = torch.tensor([False, True, False, True])
    for other in (float("inf"), float("nan"), -2.0, torch.tensor([float("inf"), 2.0, -3.0, float("-inf")])):
        want = m * other
        got = (tpu(m) * (tpu(other) if isinstance(other, torch.Tensor) else other)).cpu()
        assert torch.equal(torch.signbit(got), torch.signbit(want)) or want.isnan().any()
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def test_bool_divided_by_scalar_is_nan_where_false():
    # False / 0 is 0 / 0 = nan on CPU, False / -2.5 is -0.0; XLA rewrites
    # convert(p) / c into a select that loses both. Exact, signs of zeros too.
    m = torch.tensor([False, True, False, True])
    divisors = [0, 0.0, -0.0, float("nan"), float("inf"), -2.5, torch.tensor(0.0), torch.tensor(float("nan")),
                torch.tensor(False), torch.tensor(-0.0, dtype=torch.float16), torch.tensor([0.0, 0.0, -1.0, 0.0])]
    for d in divisors:
        td = tpu(d) if isinstance(d, torch.Tensor) else d
        fns = [lambda x, y: x / y]
        if not (isinstance(d, int) or (isinstance(d, torch.Tensor) and d.dtype == torch.bool)):
            fns += [lambda x, y: torch.div(x, y, rounding_mode="trunc"),
                    lambda x, y: torch.div(x, y, rounding_mode="floor"), lambda x, y: x // y]
        for i, fn in enumerate(fns):
            want, got = fn(m, d), fn(tpu(m), td).cpu()
            torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0, msg=lambda s: f"/ {d!r} fn {i}: {s}")
            assert torch.equal(torch.signbit(got), torch.signbit(want)) or want.isnan().any(), (d, i, got, want)


def test_uint64_alpha_is_not_silently_ignored():
    # add(x, x, alpha=2**63): alpha arrives as a uint64 Scalar. It was read as 0
    # (x + 0 * x == x); CPU gives x * (1 + 2**63). Until the eager executor
    # parses uint64 Scalars the lowering must raise rather than ignore it.
    x = torch.tensor([1.0, 2.0])
    for fn in [lambda t: torch.add(t, t, alpha=2**63), lambda t: torch.sub(t, t, alpha=2**64 - 1)]:
        want = fn(x)
        try:
            got = fn(tpu(x))
        except RuntimeError:
            continue
        assert_same(got, want)


def test_uint64_python_scalars_like_cpu():
    # (More in tests/test_unsigned.py: uint64 tensors, other dtypes, CPU's errors, compiled graphs.)
    x = torch.tensor([1.0, 2.0])
    for fn in [lambda t: torch.add(t, t, alpha=2**63), lambda t: t == 2**63, lambda t: t.clone().fill_(2**63),
               lambda t: t.clamp(max=2**63), lambda t: t * 2**63, lambda t: t.masked_fill(t > 1, 2**63),
               lambda t: 2**63 ** t, lambda t: t.long() % 2**63, lambda t: t.long() & 2**63]:
        assert_same(fn(tpu(x)), fn(x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_mul_div_by_scalar_compute_in_float32(dtype):
    # CPU's mul/div kernels take a one-element `other` at its original value in
    # float32 (opmath) and round once: 0 * 2**31 is 0, not 0 * inf = nan, in
    # float16. add/sub/remainder and a scalar `self` round the scalar to the
    # dtype first (2**-8 + 1.00390625 is 1.0 in bfloat16). Exact.
    x = torch.tensor([0.0, 1.0, -3.0, 2**-8, 100.0], dtype=dtype)
    cases = [
        lambda t: t * 2**31, lambda t: t.clone().mul_(70000), lambda t: t * 1e6, lambda t: t * 1.00390625,
        lambda t: t * torch.tensor(2**31, device=t.device), lambda t: t * torch.tensor(1e6, dtype=torch.float64),
        lambda t: t * torch.tensor([2**31]).to(t.device), lambda t: t / 1e-8, lambda t: t / 0.99609375,
        lambda t: t.clone().div_(1e-8), lambda t: t / torch.tensor(1e-8, device=t.device),
        lambda t: t.div(1e-8, rounding_mode="floor"), lambda t: t.div(1e-8, rounding_mode="trunc"),
        lambda t: t // 1e-8, lambda t: torch.floor_divide(t, 0.99609375),
        # The scalar rounded to the dtype first, as on CPU:
        lambda t: t + 1.00390625, lambda t: t - 1.00390625, lambda t: torch.add(t, 1e4, alpha=1e-4),
        lambda t: t % 1e-8, lambda t: torch.mul(torch.tensor(1e6, dtype=torch.float64).to(t.device), t),
    ]
    for i, fn in enumerate(cases):
        want, got = fn(x), fn(tpu(x)).cpu()
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0, msg=lambda m: f"case {i}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_floor_division_follows_pytorch_at_the_edges(dtype):
    # Infinite divisors (-3 // inf is -1, as in Python), signed zeros, zero
    # divisors, exact and inexact quotients, NaN.
    inf, nan = float("inf"), float("nan")
    a = torch.tensor([-3.0, 3.0, 0.0, -0.0, -0.5, 7.0, -7.0, 5.0, -5.0, 1e-30, inf, nan, 6.0, -6.0, 2.5], dtype=dtype)
    d = torch.tensor([inf, inf, -inf, inf, -inf, 2.0, 2.0, 0.0, 0.0, -3.0, 2.0, 1.0, -3.0, 3.0, 0.1], dtype=dtype)
    for got, want in ((tpu(a).div(tpu(d), rounding_mode="floor"), a.div(d, rounding_mode="floor")),
                      (tpu(a) // tpu(d), a // d), (tpu(a).div(inf, rounding_mode="floor"), a.div(inf, rounding_mode="floor"))):
        got = got.cpu()
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
        assert torch.equal(torch.signbit(got[~want.isnan()]), torch.signbit(want[~want.isnan()]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32])
@pytest.mark.parametrize("kw", [{}, dict(nan=1.5, posinf=1e10, neginf=-7.0)], ids=["defaults", "values"])
def test_nan_to_num(dtype, kw, no_cpu_fallback):
    """nan_to_num has a lowering (it ran on the CPU fallback): NaN/+inf/-inf to the
    given values or 0 and the dtype's finite extremes; values converted to the
    dtype as CPU does (1e10 is inf in float16); in place too."""
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -2.5, 0.0]).to(dtype)
    assert_same(torch.nan_to_num(tpu(x), **kw), torch.nan_to_num(x, **kw), rtol=0, atol=0)
    y = tpu(x)
    y.nan_to_num_(**kw)
    assert_same(y, torch.nan_to_num(x, **kw), rtol=0, atol=0)


def test_in_place_clamp_by_a_wider_tensor_bound_compares_in_the_wider_type():
    # CPU compares in the promoted type and casts the result: a uint8 self
    # clamped by an int64 -1 stays itself (the bound is not wrapped to 255
    # first), and one clamped by max=-1 becomes 255 after the cast.
    def run(dev):
        u = lambda: torch.tensor([1, 2, 3], dtype=torch.uint8, device=dev)  # noqa: E731
        t = lambda *v: torch.tensor(v, device=dev)  # noqa: E731
        return [u().clamp_(min=t(-1, -1, -1)), u().clamp_(max=t(300, 1, -1)), u().clamp_(min=-1),
                torch.clamp(u(), min=t(-1, -1, -1), out=torch.empty(3, dtype=torch.uint8, device=dev)),
                torch.tensor([1.5, 2.5], device=dev).clamp_(min=t(2.2, 2.2).double())]

    for got, want in zip(run("tpu"), run("cpu")):
        assert_same(got, want)


@pytest.mark.parametrize("first", [torch.float32, torch.float64])
def test_result_dtype_follows_the_default_dtype_after_a_change(first):
    """A program made under one default dtype must not serve another (int / int,
    int * 1.5, sqrt(int) take the default float dtype)."""
    other = torch.float64 if first == torch.float32 else torch.float32
    fns = [lambda x: x / 3, lambda x: x * 1.5, torch.sqrt, lambda x: x.to(torch.uint8) + 5.5, torch.sigmoid]
    x = torch.arange(1, 4)
    saved = torch.get_default_dtype()
    try:
        for dt in (first, other, first):
            torch.set_default_dtype(dt)
            for fn in fns:
                assert_same(fn(tpu(x)), fn(x), rtol=1e-6, atol=1e-6)
    finally:
        torch.set_default_dtype(saved)


@pytest.mark.parametrize("op", ["div", "div_int_scalar", "add_float", "mul_float", "true_divide", "lt_float"])
def test_integers_promote_to_the_default_dtype_float64(op):
    fns = {"div": lambda a, b: torch.div(a, b), "div_int_scalar": lambda a, b: a / 3,
           "add_float": lambda a, b: a + 0.1, "mul_float": lambda a, b: a * 1.1,
           "true_divide": lambda a, b: torch.true_divide(a, b), "lt_float": lambda a, b: a < 7.000000000000001}
    a = torch.tensor([900450186894289455, 3969543146641149120, 7, 1])
    b = torch.tensor([-3351879377641490903, 2635190182192565280, 3, 3])
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        expected, actual = fns[op](a, b), fns[op](tpu(a), tpu(b)).cpu()
    finally:
        torch.set_default_dtype(old)
    assert actual.dtype == expected.dtype and torch.equal(actual, expected), (actual, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_division_by_a_python_int_is_cpus_quotient(dtype):
    # (not x * (1 / 3): XLA's rewrite of a constant divisor is 1 ulp off in a third of the elements)
    x = make((4096,), dtype, low=-100, high=100, seed=5)
    for s in (3, 10, 7):
        assert torch.equal((tpu(x) / s).cpu(), x / s)
        assert torch.equal(torch.div(tpu(x), s, rounding_mode="trunc").cpu(), torch.div(x, s, rounding_mode="trunc"))


SHIFT_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


@pytest.mark.parametrize("dt", SHIFT_DTYPES)
def test_shifts_run_on_device_with_cpus_out_of_range_rules(dt, no_cpu_fallback):
    """<<, >> and bitwise_left/right_shift (they ran on the CPU): shift
    amounts below 0 or at the width and beyond give 0 (left, unsigned right)
    or the sign fill (signed right), as CPU's kernel."""
    torch.manual_seed(0)
    info, bits = torch.iinfo(dt), torch.iinfo(dt).bits
    x = torch.randint(info.min, info.max, (64,), dtype=torch.int64).to(dt)
    s = torch.randint(-3, bits + 3, (64,)).to(dt)
    for f in (lambda a, b: a << b, lambda a, b: a >> b, lambda a, b: a << 3, lambda a, b: a >> 100,
              torch.bitwise_left_shift, torch.bitwise_right_shift, lambda a, b: torch.bitwise_left_shift(2, b),
              lambda a, b: a.clone().__ilshift__(b), lambda a, b: a.clone().bitwise_right_shift_(b),
              lambda a, b: a << b.long()):
        assert_same(f(tpu(x), tpu(s)), f(x, s))


def test_shifts_of_floats_and_bools_raise_as_cpu():
    for a in (torch.tensor([1.5]), torch.tensor([True])):
        check_raises(lambda t: torch.bitwise_left_shift(t, t), a)
    check_raises(lambda t: t >> 1, torch.tensor([1.5]))
