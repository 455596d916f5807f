"""torch.library.custom_op under torch.compile(backend="tpu"): an op whose
Python implementation is written in torch ops is traced into the graph's
program (not cut out into pieces); one whose implementation leaves torch
(numpy) runs op by op, never with host data frozen into the program.
Results against the same code on CPU, float32, tolerance 1e-5 absolute."""
import numpy as np
import pytest
import torch

import torch_pjrt


@torch.library.custom_op("pjrt_test::scaled_silu", mutates_args=())
def scaled_silu(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * torch.sigmoid(x) * alpha


@scaled_silu.register_fake
def _(x, alpha):
    return torch.empty_like(x)


def _silu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.alpha = inputs[1]


def _silu_backward(ctx, g):
    (x,) = ctx.saved_tensors
    s = torch.sigmoid(x)
    return g * s * (1 + x * (1 - s)) * ctx.alpha, None


scaled_silu.register_autograd(_silu_backward, setup_context=_silu_setup)


@torch.library.custom_op("pjrt_test::sum_and_top", mutates_args=())
def sum_and_top(x: torch.Tensor, k: int, dims: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return x.sum(dims), x.topk(k, dim=-1).values


@sum_and_top.register_fake
def _(x, k, dims):
    return x.sum(dims), x.new_empty(*x.shape[:-1], k)


@torch.library.custom_op("pjrt_test::shifted", mutates_args=(), device_types="cpu")
def shifted(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@shifted.register_kernel("tpu")
def _(x):
    return x.abs() + 1  # differs from CPU's on purpose: the tpu kernel must be the one traced


@shifted.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("pjrt_test::numpy_sin", mutates_args=())
def numpy_sin(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.sin(x.detach().cpu().numpy())).to(x.device)


@numpy_sin.register_fake
def _(x):
    return torch.empty_like(x)


def _counts():
    m = torch_pjrt.metrics()
    return m["compiled_graphs"], m.get("partitioned_graphs", 0)


def _compiled(fn, *args):
    torch._dynamo.reset()
    before = _counts()
    out = torch.compile(fn, backend="tpu")(*args)
    return out, tuple(b - a for a, b in zip(before, _counts()))


def test_a_custom_op_in_torch_ops_is_part_of_the_program_with_its_autograd():
    x = torch.randn(5, 4)
    fn = lambda t: scaled_silu(t * 2, 0.5).pow(2).sum()  # noqa: E731
    xc, xd = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    ref = fn(xc)
    ref.backward()
    before = _counts()
    out, _ = _compiled(fn, xd)
    out.backward()
    assert tuple(b - a for a, b in zip(before, _counts())) == (2, 0)  # forward and backward, one program each, no pieces
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, atol=1e-5, rtol=1e-5)


def test_custom_op_with_several_results_and_int_list_arguments():
    x = torch.randn(3, 6)
    fn = lambda t: [r * 2 for r in sum_and_top(t + 1, 2, [0])]  # noqa: E731
    out, counts = _compiled(fn, x.to("tpu"))
    assert counts == (1, 0)
    for o, r in zip(out, fn(x)):
        torch.testing.assert_close(o.cpu(), r, atol=1e-5, rtol=1e-5)


def test_the_tpu_kernel_of_a_custom_op_is_the_one_traced():
    x = torch.randn(8)
    out, counts = _compiled(lambda t: shifted(t) * 3, x.to("tpu"))
    assert counts == (1, 0)
    torch.testing.assert_close(out.cpu(), (x.abs() + 1) * 3)


@pytest.mark.parametrize("n", [1, 7])
def test_an_implementation_through_numpy_runs_op_by_op_not_frozen(n):
    # A trace on fake tensors turns the numpy result into a constant; taking
    # it would freeze the first call's values (silently, for one element).
    # (The reason is warned once per op: "makes a tensor the trace cannot follow".)
    fn = lambda t: numpy_sin(t * 2) + 1  # noqa: E731
    out, counts = _compiled(fn, torch.full((n,), 0.3, device="tpu"))
    assert counts[1] == 1  # pieces around the op
    torch.testing.assert_close(out.cpu(), fn(torch.full((n,), 0.3)))
    again = torch.compile(fn, backend="tpu")(torch.full((n,), -1.1, device="tpu"))
    torch.testing.assert_close(again.cpu(), fn(torch.full((n,), -1.1)))


@torch.library.custom_op("pjrt_test::add_into", mutates_args=("acc",))
def add_into(acc: torch.Tensor, x: torch.Tensor, alpha: float) -> torch.Tensor:
    acc.add_(x, alpha=alpha)
    return x * 2


@add_into.register_fake
def _(acc, x, alpha):
    return torch.empty_like(x)


def test_a_custom_op_that_writes_its_arguments_is_part_of_the_program():
    # Functionalization wraps it (auto_functionalized_v2): the writes land in
    # an intermediate, in a view of it, and in a graph input.
    def fn(acc, x):
        y = x + 1
        twice = add_into(y, x, 0.5)  # writes y
        add_into(y[1:], twice[1:], -1.0)  # writes a view of y
        add_into(acc, y, 2.0)  # writes the input
        return y * 3, twice

    acc, x = torch.randn(4, 3), torch.randn(4, 3)
    acc_dev = acc.to("tpu")
    out, counts = _compiled(fn, acc_dev, x.to("tpu"))
    ref = fn(acc, x)  # (writes acc too)
    assert counts == (1, 0)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.cpu(), r, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(acc_dev.cpu(), acc, atol=1e-5, rtol=1e-5)
