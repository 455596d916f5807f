"""Reductions, softmax and norms on tpu vs PyTorch on CPU."""
import math

import pytest
import torch
import torch_pjrt

from conftest import FLOAT_DTYPES, INT_DTYPES, assert_same, make, tpu, check_raises

SHAPE = (3, 4, 5)
DIMS = [None, 1, -1, [0, 2]]


def check(fn, *inputs, rtol=None, atol=None):
    assert_same(fn(*tpu(inputs)), fn(*inputs), rtol=rtol, atol=atol)


def with_nan(dtype):
    x = make(SHAPE, dtype)
    x[1, 2, 3] = float("nan")
    x[0, 0, 0] = float("nan")
    return x


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
def test_sum_mean_amax_amin(op, dtype, dim, keepdim):
    x = make(SHAPE, dtype)
    if op in ("amax", "amin"):
        check(lambda t: getattr(t, op)(dim=[] if dim is None else dim, keepdim=keepdim), x)
    else:
        check(lambda t: getattr(t, op)(dim=dim, keepdim=keepdim), x)


@pytest.mark.parametrize("dtype", INT_DTYPES + [torch.bool])
@pytest.mark.parametrize("dim", [None, -1])
def test_sum_prod_int_bool_give_int64(dtype, dim):
    x = make(SHAPE, dtype)
    check(lambda t: t.sum(dim=dim), x)
    check(lambda t: t.prod() if dim is None else t.prod(dim), x)
    check(lambda t: t.amax(dim=[] if dim is None else dim), x)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dim", [None, 0, -1])
def test_prod(dtype, dim):
    x = make(SHAPE, dtype, low=-1.5, high=1.5)
    check(lambda t: t.prod() if dim is None else t.prod(dim, keepdim=True), x)


def test_sum_dtype_arg_and_noncontiguous():
    x = make(SHAPE, torch.float16, noncontiguous=True)
    check(lambda t: t.sum(dtype=torch.float64), x)
    check(lambda t: t.sum(1, dtype=torch.float32), x)
    check(lambda t: t.mean(-1, dtype=torch.float64), x)
    check(lambda t: t.sum(dim=(0, 2), keepdim=True), x)
    check(lambda t: t.mean(dtype=torch.float32), make(SHAPE, torch.int32))
    check(lambda t: t.amax(dim=1), make(SHAPE, noncontiguous=True))


def test_half_sum_accumulates_in_float32():
    # 4096 ones + small values: a float16 accumulator would stall at 2048.
    x = torch.ones(4096, dtype=torch.float16)
    check(lambda t: t.sum(), x, rtol=0, atol=0)


def test_zero_dim_and_empty():
    s = torch.tensor(2.5)
    for fn in [lambda t: t.sum(), lambda t: t.sum(0), lambda t: t.mean(-1, keepdim=True),
               lambda t: t.amax(), lambda t: t.max(), lambda t: t.max(0), lambda t: t.argmax(),
               lambda t: t.argmin(0), lambda t: t.prod(), lambda t: t.all(), lambda t: t.any(0)]:
        check(fn, s)
    e = torch.empty(0, 3)
    check(lambda t: t.sum(), e)
    check(lambda t: t.sum(0), e)
    check(lambda t: t.prod(0), e)
    check(lambda t: t.mean(0), e)  # nan
    check(lambda t: t.amax(1), e)  # reduces the non-empty dim: fine
    check(lambda t: t.all(), e)
    check(lambda t: t.any(0), e)
    check_raises(lambda t: t.amax(), e)
    check_raises(lambda t: t.max(), e)
    check_raises(lambda t: t.argmax(0), e)


def test_mean_of_int_raises_like_cpu():
    check_raises(lambda t: t.mean(), make(SHAPE, torch.int64))
    check_raises(lambda t: t.sum(3), make(SHAPE))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min(op, dtype):
    x = make(SHAPE, dtype, low=-2, high=2)  # small range: many ties
    check(lambda t: getattr(t, op)(), x)
    check(lambda t: tuple(getattr(t, op)(1)), x)
    check(lambda t: tuple(getattr(t, op)(-1, keepdim=True)), x)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_max_min_argmax_propagate_nan(dtype):
    x = with_nan(dtype)
    for fn in [lambda t: t.max(), lambda t: t.min(), lambda t: t.amax(1), lambda t: t.amin((0, 2)),
               lambda t: tuple(t.max(2)), lambda t: tuple(t.min(0)), lambda t: t.argmax(),
               lambda t: t.argmin(-1), lambda t: t.argmax(1)]:
        check(fn, x)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int64, torch.int8, torch.uint8])
@pytest.mark.parametrize("dim", [None, 0, -1])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin(op, dtype, dim, keepdim):
    x = make(SHAPE, dtype, low=-2, high=2)
    check(lambda t: getattr(t, op)(dim=dim, keepdim=keepdim), x)


def test_argmax_ties_pick_first():
    x = torch.tensor([[1., 3., 3., 0.], [2., 2., 2., 2.], [0., -1., 5., 5.]])
    check(lambda t: t.argmax(1), x)
    check(lambda t: t.argmin(1), x)
    check(lambda t: t.argmax(), torch.tensor([1, 7, 7, 2]))
    check(lambda t: t.argmax(1), make((3, 6), noncontiguous=True))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dim", [None, 1, [0, -1]])
@pytest.mark.parametrize("correction", [0, 1, 2])
@pytest.mark.parametrize("op", ["var", "std"])
def test_var_std(op, dtype, dim, correction):
    x = make(SHAPE, dtype)
    check(lambda t: getattr(t, op)(dim=dim, correction=correction), x)
    check(lambda t: getattr(t, op)(dim=dim, correction=correction, keepdim=True), x)


@pytest.mark.filterwarnings(r"ignore:var\(\)")
def test_var_std_overloads():
    x = make(SHAPE, noncontiguous=True)
    check(lambda t: t.var(1, unbiased=False), x)
    check(lambda t: t.std(unbiased=True), x)
    check(lambda t: torch.var_mean(t, 1), x)
    check(lambda t: torch.std_mean(t, (0, 2), correction=0, keepdim=True), x)
    check(lambda t: t.var(1), make((3, 1)))  # N - correction == 0: nan
    check(lambda t: t.var(), torch.tensor(1.5))


def test_var_std_of_constant_slices_is_exactly_zero_and_nonfinite_values_as_cpu():
    """CPU's Welford gives exactly 0 for a constant slice (and so a std
    gradient of exactly 0 there); a mean of inf and 1 is nan in var_mean."""
    x = torch.full((3, 5), 0.1)
    x[2] = torch.arange(5.0)
    for fn in (lambda t: t.var(1), lambda t: t.std(1, correction=0), lambda t: torch.var_mean(t, 1)):
        check(fn, x)
    assert (tpu(x).var(1)[:2] == 0).all() and (torch.var_mean(tpu(x), 1)[1][:2] == x[0, 0]).all()
    w = x.clone().requires_grad_()
    wt = tpu(x).requires_grad_()
    w.std(1).sum().backward()
    wt.std(1).sum().backward()
    assert (wt.grad[:2] == 0).all()
    assert_same(wt.grad, w.grad)
    bad = torch.tensor([[float("inf"), 1.0, 2.0], [1e8, 1e8 + 1, 1e8 + 2], [float("nan"), 0.0, 1.0]])
    check(lambda t: torch.var_mean(t, 1), bad)
    check(lambda t: torch.std_mean(t, 1), bad)
    check(lambda t: t.var(1), bad)
    # Over one value the mean is that value, inf too (it was nan)
    one = torch.tensor([[float("inf")], [-float("inf")], [2.0]])
    for correction in (0, 1):
        assert_same(torch.var_mean(tpu(one), 1, correction=correction)[1], torch.var_mean(one, 1, correction=correction)[1])
        assert_same(torch.std_mean(tpu(one), 1, correction=correction)[1], torch.std_mean(one, 1, correction=correction)[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize("dim", [None, 1, -1, (0, 2)])
@pytest.mark.parametrize("op", ["all", "any"])
def test_all_any(op, dtype, dim):
    x = make(SHAPE, dtype, low=0, high=2) if dtype != torch.bool else make(SHAPE, dtype)
    x[0] = 1  # a slice that is all true
    if dim is None:
        check(lambda t: getattr(t, op)(), x)
    else:
        check(lambda t: getattr(t, op)(dim), x)
        check(lambda t: getattr(t, op)(dim, keepdim=True), x)


def test_all_any_nan_is_true():
    check(lambda t: t.all(), torch.tensor([float("nan"), 1.0]))
    check(lambda t: t.any(), torch.tensor([float("nan"), 0.0]))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("ord", [2, 1, math.inf, -math.inf, 0, 3, 0.5])
def test_vector_norm(dtype, ord):
    x = make(SHAPE, dtype)
    x[0, 0, 1] = 0
    check(lambda t: torch.linalg.vector_norm(t, ord), x)
    check(lambda t: torch.linalg.vector_norm(t, ord, dim=(0, -1), keepdim=True), x)


def test_norm_variants():
    x = make(SHAPE, noncontiguous=True)
    check(lambda t: torch.norm(t), x)
    check(lambda t: torch.norm(t, p=3, dim=1), x)
    check(lambda t: t.norm(1, dim=-1, keepdim=True), x)
    check(lambda t: torch.linalg.vector_norm(t, dtype=torch.float64), make(SHAPE, torch.float16))
    check(lambda t: torch.linalg.vector_norm(t), torch.empty(0, 2))
    check_raises(lambda t: torch.linalg.vector_norm(t, math.inf), torch.empty(0, 2))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("log", [False, True])
def test_softmax(dtype, dim, log):
    fn = torch.log_softmax if log else torch.softmax
    x = make(SHAPE, dtype, low=-30, high=30)
    check(lambda t: fn(t, dim), x)


def test_softmax_edge_cases():
    big = torch.tensor([[1000.0, 1001.0, -1000.0], [-math.inf, 0.0, 1.0]])
    for fn in [torch.softmax, torch.log_softmax]:
        check(lambda t: fn(t, 1), big)  # stable: no overflow to inf/nan
        check(lambda t: fn(t, 0), torch.tensor(3.0))
        check(lambda t: fn(t, -1), torch.empty(2, 0))
        check(lambda t: fn(t, 1), make(SHAPE, noncontiguous=True))
        check(lambda t: fn(t, 1, dtype=torch.float32), make(SHAPE, torch.float16))
        check(lambda t: fn(t, 1), torch.tensor([[-math.inf, -math.inf]]))  # nan like CPU
    x = make((2, 3), torch.bfloat16)
    check(lambda t: torch.ops.aten._softmax(t, 1, False), x)
    check(lambda t: torch.nn.functional.softmax(t, dim=0, dtype=torch.float64), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int32, torch.uint8])
@pytest.mark.parametrize("shape", [(5, 7), (7, 5), (4, 4), (0, 3)])
def test_trace(dtype, shape, no_cpu_fallback):
    x = make(shape, dtype)
    assert_same(torch.trace(tpu(x)), torch.trace(x))
    if 0 not in shape:
        assert_same(torch.trace(tpu(x).t()), torch.trace(x.t()))  # a strided view


def test_trace_bad_input_like_cpu():
    check_raises(torch.trace, torch.ones(3))
    check_raises(torch.trace, torch.ones(2, 2, dtype=torch.bool))  # NotImplementedError, as CPU
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.trace(tpu(torch.ones(2, 2, dtype=torch.bool)))


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
@pytest.mark.parametrize("shapes", [((5, 3), (4, 3)), ((2, 5, 3), (1, 4, 3))], ids=["2d", "batch-broadcast"])
def test_cdist_forward_backward(p, shapes, no_cpu_fallback):
    """torch.cdist (aten::_cdist_forward / _cdist_backward, which ran on the CPU
    fallback; DETR's matcher uses p=1) against CPU: distances and both inputs'
    gradients, with a zero distance among them (CPU's 0 gradient there)."""
    x1, x2 = make(shapes[0], torch.float64, seed=1), make(shapes[1], torch.float64, seed=2)
    x2[..., 0, :] = x1[:1, 0, :] if x1.dim() == 3 else x1[0]
    g = make(torch.cdist(x1, x2, p=p).shape, torch.float64, seed=3)
    results = []
    for a, b, gg in ((x1, x2, g), (tpu(x1), tpu(x2), tpu(g))):
        a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
        d = torch.cdist(a, b, p=p)
        (d * gg).sum().backward()
        results.append((d, a.grad, b.grad))
    assert_same(results[1], results[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("keepdim", [False, True])
def test_empty_dim_list_reduces_as_cpu(keepdim):
    # dim=(): all/any reduce nothing, sum/mean/amax/var everything. all/any
    # failed to compile on tpu (a full reduction into an unreduced shape).
    x = make((2, 3))
    for fn in (torch.all, torch.any, torch.sum, torch.mean, torch.amax, torch.var, torch.nansum):
        assert_same(fn(tpu(x), dim=(), keepdim=keepdim), fn(x, dim=(), keepdim=keepdim))
    b = make((2, 3), torch.bool)
    for fn in (torch.all, torch.any):
        assert_same(fn(tpu(b), dim=(), keepdim=keepdim), fn(b, dim=(), keepdim=keepdim))


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_var_std_warn_on_nonpositive_degrees_of_freedom_like_cpu(mode):
    """CPU's kernel warns on every call where correction >= N; a lowering's
    warning belongs to its program and is given on every call that uses it."""
    import warnings
    cases = [
        lambda d: torch.std(torch.ones(3, device=d), correction=3),
        lambda d: torch.var(torch.ones(3, 4, device=d), dim=0, correction=5),
        lambda d: torch.std_mean(torch.ones(3, device=d), correction=4),
        lambda d: torch.var_mean(torch.ones(1, device=d)),
        lambda d: torch.var(torch.ones(5, device=d)),  # no warning
        lambda d: torch.std(torch.ones(3, device=d), correction=2.5),  # no warning
    ]

    def warned(fn, d):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(3):
                fn(d)
            if d == "tpu":
                torch.tpu.synchronize()
        return [str(x.message).split(" (Triggered")[0] for x in w if "degrees of freedom" in str(x.message)]

    for fn in cases:
        expected = warned(fn, "cpu")
        if mode == "fused":
            with torch_pjrt.fused():
                got = warned(fn, "tpu")
        else:
            got = warned(fn, "tpu")
        assert got == expected


@pytest.mark.parametrize("a_shape,b_shape", [((0, 4, 5), (3, 5)), ((2, 0, 5), (3, 5)), ((2, 4, 5), (3, 5)),
                                             ((4, 0), (3, 0))])
@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0])
def test_cdist_gradients_with_empty_and_broadcast_batches(a_shape, b_shape, p):
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    ac, bc, at, bt = a.clone().requires_grad_(), b.clone().requires_grad_(), tpu(a).requires_grad_(), tpu(b).requires_grad_()
    want, got = torch.cdist(ac, bc, p), torch.cdist(at, bt, p)
    assert_same(got, want)
    g = torch.randn(want.shape)
    want.backward(g)
    got.backward(tpu(g))
    assert_same(at.grad, ac.grad, rtol=1e-4, atol=1e-4)
    assert_same(bt.grad, bc.grad, rtol=1e-4, atol=1e-4)
