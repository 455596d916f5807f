"""Three-operand pointwise ops (addcmul, addcdiv, lerp; where, clamp with tensor
bounds, masked_fill with a tensor value) on tpu vs PyTorch on CPU, forward and backward."""
import pytest
import torch

from conftest import assert_same, make, tpu, check_raises, check

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [1, 0.5, -2])
def test_addcmul_addcdiv(dtype, value):
    x, t1 = make((3, 4), dtype), make((4,), dtype, seed=1)
    t2 = make((3, 1), dtype, low=0.5, high=3, seed=2)  # away from 0 for addcdiv
    check(lambda x, a, b: torch.addcmul(x, a, b, value=value), x, t1, t2)
    check(lambda x, a, b: torch.addcdiv(x, a, b, value=value), x, t1, t2)


def test_addcmul_int_inplace_and_promotion():
    x, a, b = make((3, 4), torch.int32), make((3, 4), torch.int32, seed=1), make((4,), torch.int32, seed=2)
    check(lambda x, a, b: torch.addcmul(x, a, b, value=3), x, a, b)
    check(lambda x, a, b: x.clone().addcmul_(a, b, value=-2), x, a, b)
    check(lambda x, a, b: x.clone().addcdiv_(a, b, value=0.25),
          make((3, 4)), make((3, 4), seed=1), make((3, 4), low=1, high=2, seed=2))
    # Mixed float dtypes promote.
    check(lambda x, a, b: torch.addcmul(x, a, b), make((3, 4), torch.bfloat16), make((3, 4), seed=1),
          make((3, 4), torch.bfloat16, seed=2))


def test_addcdiv_int_raises():
    x = make((3,), torch.int64)
    check_raises(lambda x, a, b: torch.addcdiv(x, a, b), x, x, x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight", [0.0, 0.3, 0.5, 0.7, 1.0, -0.5, 1.5])
def test_lerp_scalar(dtype, weight):
    check(lambda a, b: torch.lerp(a, b, weight), make((3, 4), dtype), make((3, 4), dtype, seed=1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_lerp_tensor(dtype):
    w = make((4,), dtype, low=-0.5, high=1.5, seed=2)
    check(lambda a, b, w: torch.lerp(a, b, w), make((3, 4), dtype), make((3, 1), dtype, seed=1), w)
    check(lambda a, b, w: a.clone().lerp_(b, w), make((3, 4), dtype), make((3, 4), dtype, seed=1), w)


def test_lerp_bad_dtype():
    check_raises(lambda a, b: torch.lerp(a, b, 0.5), make((3,)), make((3,), torch.float64))


# where / clamp(Tensor) / masked_fill(Tensor) are lowered in compare_logical.cpp;
# checked here as the three-operand family, forward and backward.

@pytest.mark.parametrize("dtype", DTYPES)
def test_where_clamp_tensor_masked_fill_tensor(dtype):
    x, y = make((3, 4), dtype), make((4,), dtype, seed=1)
    cond = make((3, 4), torch.bool, seed=2)
    check(lambda c, x, y: torch.where(c, x, y), cond, x, y)
    lo, hi = make((4,), dtype, low=-2, high=0, seed=3), make((3, 1), dtype, low=0, high=2, seed=4)
    check(lambda x, lo, hi: x.clamp(lo, hi), x, lo, hi)
    check(lambda x, lo: x.clamp(min=lo), x, lo)
    check(lambda x, hi: torch.clamp(x, max=hi), x, hi)
    check(lambda x, c, v: x.masked_fill(c, v), x, cond, torch.tensor(2.5, dtype=dtype))  # grad of v too


def test_clamp_tensor_int_and_bad_input():
    x = make((3, 4), torch.int32)
    check(lambda x, lo, hi: x.clamp(lo, hi), x, make((4,), torch.int32, low=-2, high=0), make((4,), torch.int32))
    check_raises(lambda x, m, v: x.masked_fill(m, v), make((3,)), make((3,), torch.bool), make((2,)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_addcmul_nonfinite_times_false_is_nan(dtype):
    # XLA rewrote convert(False) * nan into select(False, nan, 0): 0, where CPU gives nan.
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 2.0, -0.0], dtype=dtype)
    p = torch.tensor([False, False, False, False, True])
    zero = torch.zeros(5, dtype=dtype)
    check(lambda s, a, b: torch.addcmul(s, a, b, value=0.5), zero, x, p)
    check(lambda s, a, b: torch.addcmul(s, a, b), zero, p, x)
    check(lambda s, a, b: s.clone().addcmul_(a, b), zero, x, p)
