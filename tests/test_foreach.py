"""_foreach_ ops on tpu against PyTorch on CPU: List, Scalar, ScalarList and
Tensor overloads, functional and in place, with NaN/inf, and CPU's argument
checks for lists too large for the CPU probe."""
import math

import pytest
import torch

from conftest import assert_same, tpu

NAN, INF = math.nan, math.inf


def lists(seed=0, sizes=(3, 1, 5)):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, generator=g) for n in sizes]
    xs[0][0], xs[0][1], xs[-1][-1] = NAN, INF, -INF
    return xs


BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max", "pow"]


def both(fn, *args):
    """fn on CPU lists and on tpu copies; returns (cpu, tpu) results (lists in place)."""
    cpu = fn(*[[t.clone() for t in a] if isinstance(a, list) and a and isinstance(a[0], torch.Tensor)
                else a for a in args])
    dev = fn(*[[tpu(t) for t in a] if isinstance(a, list) and a and isinstance(a[0], torch.Tensor)
                else a for a in args])
    return cpu, dev


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("form", ["List", "Scalar", "ScalarList"])
@pytest.mark.parametrize("inplace", [False, True])
def test_binary_foreach_as_cpu(name, form, inplace, no_cpu_fallback):
    if name in ("maximum", "minimum") and form != "List":
        pytest.skip("no such overload")
    xs, ys = lists(0), lists(1)
    second = {"List": ys, "Scalar": 0.5, "ScalarList": [0.5, -1.0, 2.0]}[form]
    op = getattr(torch, f"_foreach_{name}_" if inplace else f"_foreach_{name}")

    def run(a, b):
        out = op(a, b)
        return a if inplace else out

    cpu, dev = both(run, xs, second)
    for c, d in zip(cpu, dev):
        assert_same(d, c)


@pytest.mark.parametrize("name", ["addcmul", "addcdiv", "lerp"])
def test_ternary_foreach_as_cpu(name, no_cpu_fallback):
    xs, ys, zs = lists(0), lists(1), [t.abs() + 0.5 for t in lists(2)]
    op = getattr(torch, f"_foreach_{name}_")
    third = 0.3 if name == "lerp" else 0.7

    def run(a, b, c):
        op(a, b, c, third) if name != "lerp" else op(a, b, third)
        return a

    cpu, dev = both(run, xs, ys, zs)
    for c, d in zip(cpu, dev):
        assert_same(d, c)


@pytest.mark.parametrize("name", ["sqrt", "exp", "neg", "abs", "reciprocal", "sign", "zero"])
def test_unary_foreach_as_cpu(name, no_cpu_fallback):
    xs = [t.abs() for t in lists(3)] if name == "sqrt" else lists(3)
    op = getattr(torch, f"_foreach_{name}_")

    def run(a):
        op(a)
        return a

    cpu, dev = both(run, xs)
    for c, d in zip(cpu, dev):
        assert_same(d, c)


def test_clamp_with_a_tensor_list_bound_is_applied():
    # The List overloads name their bound `other`, clamp_min/max.Tensor `min`/`max`:
    # the bound was dropped and the input returned unchanged.
    a = [torch.tensor([1.0, 5.0, NAN]), torch.tensor([-4.0, 0.5])]
    b = [torch.tensor([3.0, 3.0, 0.0]), torch.tensor([0.0, NAN])]
    for name in ("clamp_max", "clamp_min"):
        cpu, dev = both(lambda x, y: (getattr(torch, f"_foreach_{name}_")(x, y), x)[1], a, b)
        for c, d in zip(cpu, dev):
            assert_same(d, c)


@pytest.mark.parametrize("numel", [10, 5000])
def test_sub_with_a_bool_raises_as_cpu_at_any_size(numel):
    xs = [tpu(torch.randn(numel))]
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor"):
        torch._foreach_sub(xs, True)
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor"):
        torch._foreach_sub_([x.clone() for x in xs], True)


def test_norm_as_cpu(no_cpu_fallback):
    xs = [t.nan_to_num(0, 0, 0) for t in lists(4, (7, 2, 33))]
    for ord in (1, 2, INF):
        cpu, dev = both(lambda a: torch._foreach_norm(a, ord), xs)
        for c, d in zip(cpu, dev):
            assert_same(d, c)


@pytest.mark.parametrize("numel", [10, 5000])
def test_cpus_dtype_errors_at_any_size(numel):
    # Calls above the CPU probe's size get the checks from the lowerings.
    ints = [tpu(torch.ones(numel, dtype=torch.long)) for _ in range(2)]
    with pytest.raises(NotImplementedError, match="\"lerp_kernel_tensor\" not implemented for 'Long'"):
        torch._foreach_lerp(ints, ints, ints)
    with pytest.raises(RuntimeError, match="Expected a floating point or complex tensor as input. Got Long"):
        torch._foreach_norm(ints, 2, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="\"addcmul_cpu_out\" not implemented for 'Bool'"):
        b = [tpu(torch.ones(numel, dtype=torch.bool))]
        torch._foreach_addcmul(b, b, b)


def test_scalar_lists_with_bools(no_cpu_fallback):
    xs = lists(5)
    for scalars in ([True, False, True], [True, 2, 0.5]):
        for name in ("add", "mul", "sub" if False else "div"):
            cpu, dev = both(lambda a, s: getattr(torch, f"_foreach_{name}")(a, s), xs, scalars)
            for c, d in zip(cpu, dev):
                assert_same(d, c)
    with pytest.raises(TypeError, match="complex scalars are not supported"):
        torch._foreach_add([tpu(t) for t in xs], [1, 2j, 3.5])
