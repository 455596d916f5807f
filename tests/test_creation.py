"""Factory functions on tpu (zeros, ones, full, empty, arange, linspace, eye and
the *_like / new_* variants) compared with the same call on CPU."""
import pytest
import torch

from conftest import ALL_DTYPES, FLOAT_DTYPES, assert_same, make, tpu


def same_factory(fn, **kw):
    """fn(device=..., **kw) on tpu vs on CPU."""
    actual = fn(device="tpu", **kw)
    assert actual.device.type == "tpu"
    assert_same(actual, fn(device="cpu", **kw))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3)])
def test_zeros_ones_full(dtype, shape):
    same_factory(lambda **k: torch.zeros(shape, **k), dtype=dtype)
    same_factory(lambda **k: torch.ones(shape, **k), dtype=dtype)
    same_factory(lambda **k: torch.full(shape, 1 if dtype == torch.bool else 7, **k), dtype=dtype)


def test_full_infers_dtype():
    same_factory(lambda **k: torch.full((2, 2), 3, **k))
    same_factory(lambda **k: torch.full((2, 2), 2.5, **k))
    same_factory(lambda **k: torch.full((2,), True, **k))
    same_factory(lambda **k: torch.full((3,), -1.5, **k), dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_empty(dtype):
    for t in (torch.empty(2, 3, device="tpu", dtype=dtype), torch.empty((0, 4), device="tpu", dtype=dtype),
              torch.empty_like(tpu(make((3,), dtype))), tpu(make((1,))).new_empty((2, 2), dtype=dtype)):
        assert t.device.type == "tpu"
    t = torch.empty(2, 3, device="tpu", dtype=dtype)
    assert t.dtype == dtype and t.shape == (2, 3)
    assert t.cpu().shape == (2, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.bool])
def test_like_and_new(dtype):
    x = make((2, 3), dtype, noncontiguous=True)
    check = lambda fn: assert_same(fn(tpu(x)), fn(x))  # noqa: E731
    check(torch.zeros_like)
    check(torch.ones_like)
    check(lambda t: torch.full_like(t, 1))
    check(lambda t: torch.zeros_like(t, dtype=torch.float64))
    check(lambda t: torch.ones_like(t, dtype=torch.int8))
    check(lambda t: t.new_zeros((4,)))
    check(lambda t: t.new_ones((2, 2), dtype=torch.float32))
    check(lambda t: t.new_full((3,), 1))
    check(lambda t: t.new_tensor([1, 0, 1]))
    assert torch.empty_like(tpu(x)).shape == x.shape


def test_device_arguments():
    assert torch.zeros(2, device=torch.device("tpu")).device.type == "tpu"
    assert torch.ones(2, device="tpu:0").device == torch.device("tpu:0")
    assert torch.arange(3, device="tpu:1").device == torch.device("tpu:1")
    assert_same(torch.arange(3, device="tpu:1"), torch.arange(3))
    x = torch.zeros(2, device="tpu", dtype=torch.float16)
    assert x.dtype == torch.float16
    assert torch.zeros_like(tpu(make((2,))), device="cpu").device.type == "cpu"


# ---- arange -------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [(5,), (0,), (2, 9), (-3, 4, 2), (10, 0, -3), (0, 5, 7),
                                  (5, 5), (-7, -20, -4)])
@pytest.mark.parametrize("dtype", [None, torch.int32, torch.int64, torch.float32, torch.float64,
                                   torch.bfloat16, torch.float16, torch.uint8, torch.int8])
def test_arange_int_args(args, dtype):
    if dtype == torch.uint8 and any(a < 0 for a in args):
        pytest.skip("negative range in uint8")
    same_factory(lambda **k: torch.arange(*args, **k), dtype=dtype)


@pytest.mark.parametrize("args", [(0, 1, 0.1), (-1.5, 2.25, 0.25), (3.0,), (1.0, -1.0, -0.3),
                                  (0, 100, 0.7), (1e-3, 2e-3, 1e-4)])
@pytest.mark.parametrize("dtype", [None, torch.float64, torch.bfloat16, torch.float16])
def test_arange_float_args(args, dtype):
    same_factory(lambda **k: torch.arange(*args, **k), dtype=dtype)


def test_arange_large_and_out():
    same_factory(lambda **k: torch.arange(100000, **k))
    same_factory(lambda **k: torch.arange(0, 1000, 0.01, **k))
    same_factory(lambda **k: torch.arange(2**40, 2**40 + 10, **k))
    out = tpu(torch.empty(0))
    torch.arange(1, 4, out=out)
    assert_same(out, torch.arange(1, 4, dtype=torch.float32))


def test_arange_errors():
    for args in [(0, 5, 0), (5, 0, 1)]:
        with pytest.raises(RuntimeError):
            torch.arange(*args)
        with pytest.raises(RuntimeError):
            torch.arange(*args, device="tpu")


# ---- linspace -----------------------------------------------------------------------------

CASES = [(0, 1, 7), (-3.3, 7.1, 100), (0.1, 1e3, 1001), (1, -2.7, 33), (0, 1, 1), (2.5, 2.5, 5),
         (0, 1, 0), (-1, 1, 2), (5, -5, 11), (-7.7, 1e4, 29), (3.14159, -2.71828, 25),
         (-1e4, 3.3e4, 100000), (-1, 200, 9), (300, 1, 5)]


@pytest.mark.parametrize("start,end,n", CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int64, torch.int32, torch.uint8])
def test_linspace_bitwise(start, end, n, dtype):
    # Bit-exact: start + step*i (first half) and end - step*(n-1-i) (second half),
    # each product-sum rounded once as in PyTorch's compiled CPU kernel.
    try:
        expected = torch.linspace(start, end, n, dtype=dtype)
    except RuntimeError:  # value out of range for the dtype
        with pytest.raises(RuntimeError):
            torch.linspace(start, end, n, dtype=dtype, device="tpu")
        return
    actual = torch.linspace(start, end, n, dtype=dtype, device="tpu")
    assert_same(actual, expected, rtol=0, atol=0)


def test_linspace_tensor_args():
    s, e = torch.tensor(-2.5), torch.tensor(4.0)
    assert_same(torch.linspace(tpu(s), tpu(e), 13, device="tpu"), torch.linspace(s, e, 13), rtol=0, atol=0)


def test_linspace_default_dtype_and_error():
    same_factory(lambda **k: torch.linspace(-2, 2, 9, **k))
    with pytest.raises(RuntimeError):
        torch.linspace(0, 1, -1, device="tpu")
    out = tpu(torch.empty(0, dtype=torch.float64))
    torch.linspace(0, 1, 5, out=out)
    assert_same(out, torch.linspace(0, 1, 5, dtype=torch.float64))


# ---- eye ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [(0,), (1,), (3,), (3, 5), (5, 2), (4, 0)])
@pytest.mark.parametrize("dtype", [None, torch.float64, torch.bfloat16, torch.int64, torch.bool])
def test_eye(args, dtype):
    same_factory(lambda **k: torch.eye(*args, **k), dtype=dtype)


def test_eye_out_and_error():
    out = tpu(torch.empty(0, dtype=torch.int32))
    torch.eye(3, 2, out=out)
    assert_same(out, torch.eye(3, 2, dtype=torch.int32))
    with pytest.raises(RuntimeError):
        torch.eye(-1, device="tpu")


def test_first_arange_with_float_bounds_prints_no_warning():
    # The executor probes other float values to learn whether arange's
    # program depends on them; those probes once resized the call's full out=
    # tensor on meta and PyTorch warned "An output with one or more elements
    # was resized" on the user's first arange. A fresh process: the probe runs
    # once per process.
    import subprocess
    import sys
    code = ("import torch, torch_pjrt\n"
            "print(torch.arange(4.0, device='tpu').cpu().tolist(), torch.arange(1.0, 3.0, 0.5, device='tpu').cpu().tolist())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0.0, 1.0, 2.0, 3.0] [1.0, 1.5, 2.0, 2.5]"
    assert "Warning" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("case", ["narrow", "square", "transposed", "fewer", "linspace_square", "linspace_narrow"])
def test_range_out_of_as_many_elements_keeps_its_shape_as_cpu(case):
    """CPU's arange_out/linspace_out resize only on another element count; the
    Meta kernels resized to 1-d, which wrote a narrowed out= into the wrong
    elements of its base."""
    def run(d):
        base = torch.zeros(2, 3, device=d) if "narrow" in case else torch.zeros(2, 2, device=d)
        out = {"narrow": lambda: base.narrow(1, 1, 2), "linspace_narrow": lambda: base.narrow(1, 1, 2),
               "transposed": lambda: base.t()}.get(case, lambda: base)()
        if case == "fewer":
            out = torch.zeros(3, device=d)
            r = torch.arange(0, 5, out=out)
        elif case.startswith("linspace"):
            r = torch.linspace(0, 1, 4, out=out)
        else:
            r = torch.arange(0, 4, out=out)
        assert r is out
        return base.cpu(), out.cpu()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (CPU warns when it resizes "fewer")
        expected = run("cpu")
        actual = run("tpu")
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and torch.equal(a, e), (a, e)
