"""uint16/uint32/uint64 (PyTorch's "barebones" unsigned types) on tpu against
CPU: creation, copies, conversions, the bitwise ops and comparisons CPU has,
view(dtype) reinterpretation; ops CPU does not implement raise the same type."""
import pytest
import torch

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
