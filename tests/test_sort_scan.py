"""Cumulative ops (cumsum, cumprod, logcumsumexp) and sorting/selection (sort,
argsort, msort, topk, kthvalue, median, nanmedian) on tpu vs PyTorch on CPU."""
import math

import pytest
import torch
import torch_pjrt

from conftest import INT_DTYPES, assert_same, make, tpu, check_raises

# Every test here must run on lowered ops only.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

NAN = float("nan")


def call_tpu(fn, *inputs):
    return fn(*inputs)


def check(fn, *inputs, rtol=None, atol=None):
    expected = fn(*inputs)
    assert_same(call_tpu(fn, *tpu(inputs)), expected, rtol=rtol, atol=atol)


def check_grad(fn, x, rtol=None, atol=None):
    """fn's output and d(fn)/dx on tpu match CPU (grad_output fixed and random)."""
    def run(dev):
        xd = x.detach().to(dev).requires_grad_(True)
        y = fn(xd)
        y.backward(make(y.shape, y.dtype, low=-1, high=1, seed=9).to(dev))
        return y.detach(), xd.grad
    res = [run("cpu"), call_tpu(run, "tpu")]
    assert_same(res[1][0], res[0][0], rtol, atol)
    assert_same(res[1][1], res[0][1], rtol, atol)


def distinct(shape, dtype=torch.float32, seed=0):
    """A random permutation of distinct, exactly representable values (no ties)."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    return (torch.randperm(n, generator=g).to(torch.float64) - n // 2).reshape(shape).to(dtype)


# ---- scans -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_cumsum_cumprod_float(op, dtype, dim):
    x = make((5, 7, 3), dtype, low=-1.5, high=1.5)
    check_grad(lambda t: getattr(t, op)(dim), x)


@pytest.mark.parametrize("dtype", INT_DTYPES + [torch.bool])
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_cumsum_cumprod_int(op, dtype):
    x = make((4, 9), dtype, low=-3, high=3) if dtype != torch.bool else make((4, 9), dtype)
    check(lambda t: getattr(t, op)(1), x)  # promoted to int64 like CPU
    if dtype != torch.bool:  # CPU has no bool cumsum/cumprod kernel
        check(lambda t: getattr(t, op)(0, dtype=dtype), x)
    check(lambda t: getattr(t, op)(-1, dtype=torch.float32), x)


def test_scan_edge_cases():
    check(lambda t: t.cumsum(0), torch.tensor(2.5))
    check(lambda t: t.cumprod(-1), torch.tensor(3))
    check(lambda t: t.cumsum(1), torch.empty(3, 0))
    check(lambda t: t.cumsum(0), torch.arange(1000, dtype=torch.float32))  # many log-steps
    check(lambda t: t.cumsum(0), make((17, 3), noncontiguous=True))
    check(lambda t: t.cumprod(1), torch.tensor([[1.0, NAN, 2.0], [math.inf, 0.0, 3.0]]))
    out = torch.empty(4, 9, dtype=torch.float64)
    x = make((4, 9))
    assert_same(torch.cumsum(x.to("tpu"), 1, out=out.to("tpu")), torch.cumsum(x, 1, out=out))
    y = make((4, 9))
    y_t = y.to("tpu")
    y_t.cumsum_(0)
    assert_same(y_t, y.cumsum_(0))
    check_raises(lambda t: t.cumsum(2), make((3, 4)))


def test_cumprod_backward_with_zeros():
    # cumprod_backward takes a separate path when the input holds zeros.
    x = make((3, 6), low=-2, high=2)
    x[0, 2] = 0
    x[1, 1] = 0
    x[1, 4] = 0
    check_grad(lambda t: t.cumprod(1), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [0, -1])
def test_logcumsumexp(dtype, dim):
    x = make((5, 6), dtype, low=-20, high=20)
    x[0, 0] = -math.inf
    check_grad(lambda t: torch.logcumsumexp(t, dim), x)
    check(lambda t: torch.logcumsumexp(t, 1),
          torch.tensor([[-math.inf, -math.inf, 1.0], [math.inf, math.inf, 0.0], [1.0, NAN, 2.0]]))


# ---- sort ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable_with_ties_and_nan(dtype, dim, descending):
    x = make((6, 7), dtype, low=-2, high=2).round()  # many ties
    x[1, 2] = x[3, 2] = x[4, 4] = NAN
    x[2, 3], x[2, 5] = -0.0, 0.0
    x[0, 1], x[5, 6] = math.inf, -math.inf
    check(lambda t: tuple(torch.sort(t, dim=dim, descending=descending, stable=True)), x)
    check(lambda t: torch.argsort(t, dim=dim, descending=descending, stable=True), x)


@pytest.mark.parametrize("dtype", INT_DTYPES + [torch.bool])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_int_bool(dtype, descending):
    x = make((5, 8), dtype, low=-100, high=100) if dtype != torch.bool else make((5, 8), dtype)
    check(lambda t: tuple(torch.sort(t, dim=1, descending=descending, stable=True)), x)
    check(lambda t: torch.sort(t, 0, descending=descending)[0], x)


def test_sort_variants_and_grad():
    x = distinct((4, 6))
    check(lambda t: tuple(t.sort()), x)  # sort.default (stable=False): no ties, same result
    check(lambda t: tuple(t.sort(0, True)), x)
    check(lambda t: torch.msort(t), x)
    check(lambda t: t.argsort(1, descending=True), x)
    check(lambda t: tuple(t.sort()), torch.tensor(1.5))
    check(lambda t: tuple(t.sort(0)), torch.empty(0, 3))
    check(lambda t: tuple(t.sort(1)), make((3, 8), noncontiguous=True))
    check_grad(lambda t: t.sort(1, descending=True)[0], x)
    check_raises(lambda t: torch.sort(t, dim=2, stable=True), x)


# ---- topk / kthvalue / median ------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k", [0, 1, 3])
def test_topk(dtype, dim, largest, k):
    x = distinct((5, 6), dtype)
    check(lambda t: tuple(t.topk(k, dim, largest=largest)), x)
    # sorted=False: any order; compare as sets (sorted by value).
    def unsorted(t):
        v, i = t.topk(k, dim, largest=largest, sorted=False)
        order = v.argsort(dim)
        return v.gather(dim, order), i.gather(dim, order)
    check(unsorted, x)


def test_topk_nan_grad_and_errors():
    x = torch.tensor([[1.0, NAN, 3.0, -1.0], [2.0, 0.5, NAN, NAN]])
    check(lambda t: tuple(t.topk(2)), x)  # NaN is largest
    check(lambda t: t.topk(2, largest=False)[0], x)
    check_grad(lambda t: t.topk(3, 1)[0], distinct((3, 5)))
    check(lambda t: tuple(t.topk(1)), torch.tensor(2.0))
    check_raises(lambda t: t.topk(7), distinct((2, 6)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("keepdim", [False, True])
def test_kthvalue_median(dtype, keepdim):
    x = distinct((5, 7), dtype)
    check(lambda t: tuple(t.kthvalue(3, 1, keepdim)), x)
    check(lambda t: tuple(t.kthvalue(1, 0, keepdim)), x)
    check(lambda t: tuple(t.median(1, keepdim)), x)
    check(lambda t: tuple(t.median(0, keepdim)), x)  # even length: lower median
    check(lambda t: t.median(), x)
    check(lambda t: tuple(t.nanmedian(1, keepdim)), x)


def test_median_nan_and_grad():
    x = torch.tensor([[3.0, NAN, 1.0, NAN, 2.0], [5.0, 4.0, 1.0, 0.0, 2.0], [NAN, 1.0, 2.0, 3.0, 4.0]])
    check(lambda t: tuple(t.median(1)), x)  # NaN and the index of the first NaN
    check(lambda t: t.median(), x)
    check(lambda t: t.nanmedian(), x)
    check(lambda t: tuple(t.nanmedian(1)), x)
    check(lambda t: t.nanmedian(1)[0], torch.tensor([[NAN, NAN], [1.0, NAN]]))  # all-NaN row: NaN
    check(lambda t: t.median(), torch.empty(0))
    check_grad(lambda t: t.median(1)[0], distinct((3, 5)))
    check_grad(lambda t: t.kthvalue(2, 0)[0], distinct((3, 5)))
    check_raises(lambda t: t.kthvalue(6, 1), distinct((3, 5)))


# PyTorch's Meta kernels of sort.default and median.dim skip these checks: the
# lowering's std::out_of_range reaches Python as IndexError, as on CPU.
def test_dim_errors_missed_by_meta_raise_index_error():
    check_raises(lambda t: t.sort(2), distinct((3, 5)))
    check_raises(lambda t: t.median(1), torch.empty(2, 0))


@pytest.mark.parametrize("k", [0, 1])
def test_topk_of_a_0d_tensor(k):
    # CPU gives the element itself for k = 0 too; tpu's program failed to compile.
    x = torch.tensor(3.0)
    v, i = torch.topk(tpu(x), k)
    ev, ei = torch.topk(x, k)
    assert_same(v, ev)
    assert_same(i, ei)


def test_kthvalue_over_an_empty_dim_raises_index_error_as_cpu():
    # CPU's shape check raises IndexError (both CPU probes fail alike, so the
    # CPU check's IndexError is kept, cpu_check.cpp).
    x = torch.zeros(3, 0)
    with pytest.raises(IndexError, match="Expected reduction dim 1 to have non-zero size"):
        torch.kthvalue(x, 1, 1)
    with pytest.raises(IndexError, match="Expected reduction dim 1 to have non-zero size"):
        torch.kthvalue(tpu(x), 1, 1)
