"""Activation functions and their backward ops on tpu vs PyTorch on CPU: outputs and
input gradients from the same inputs and upstream gradient."""
import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same, make, tpu

DTYPES = [torch.float32, torch.bfloat16]
SHAPE = (4, 6)

# Values on the branch points of the piecewise functions (0, +-3, hardtanh's
# bounds, softplus's threshold), where the backward conventions differ.
EDGES = torch.tensor([0.0, -3.0, 3.0, -1.0, 1.0, 2.0, -2.0, 6.0, 20.0, -0.5, 0.5, 10.0])

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "leaky_relu": F.leaky_relu,
    "leaky_relu_0.2": lambda x: F.leaky_relu(x, 0.2),
    "leaky_relu_neg": lambda x: F.leaky_relu(x, -0.5),
    "elu": F.elu,
    "elu_0.5": lambda x: F.elu(x, alpha=0.5),
    "selu": F.selu,
    "celu": lambda x: F.celu(x, alpha=1.5),
    "hardtanh": F.hardtanh,
    "hardtanh_wide": lambda x: F.hardtanh(x, -2.0, 1.0),
    "relu6": F.relu6,
    "softplus": F.softplus,
    "softplus_beta": lambda x: F.softplus(x, beta=2.0, threshold=1.0),
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "mish": F.mish,
    "logsigmoid": F.logsigmoid,
    "glu": F.glu,
    "glu_dim0": lambda x: F.glu(x, 0),
    "threshold": lambda x: F.threshold(x, 0.5, -2.0),
}


def check_grad(fn, x, rtol=None, atol=None):
    xc, xt = x.clone().requires_grad_(), tpu(x).requires_grad_()
    out_c, out_t = fn(xc), fn(xt)
    assert_same(out_t, out_c, rtol=rtol, atol=atol)
    g = make(out_c.shape, out_c.dtype, seed=5)
    out_c.backward(g)
    out_t.backward(tpu(g))
    assert_same(xt.grad, xc.grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_and_grad(name, dtype):
    check_grad(ACTIVATIONS[name], make(SHAPE, dtype, low=-5, high=5))


@pytest.mark.parametrize("name", [n for n in ACTIVATIONS if not n.startswith("glu")])
def test_branch_points(name):
    check_grad(ACTIVATIONS[name], EDGES.clone())


def test_large_and_special_values():
    x = torch.tensor([-100.0, -30.0, 30.0, 100.0, float("inf"), -float("inf"), float("nan")])
    for name in ["relu", "sigmoid", "tanh", "softplus", "mish", "logsigmoid", "elu", "leaky_relu",
                 "hardtanh", "hardswish", "hardsigmoid", "silu"]:
        fn = ACTIVATIONS[name]
        assert_same(fn(tpu(x)), fn(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", [lambda t: F.elu(t, inplace=True), lambda t: F.leaky_relu(t, 0.1, inplace=True),
                                lambda t: F.hardtanh(t, inplace=True), lambda t: F.relu6(t, inplace=True),
                                lambda t: F.relu(t, inplace=True), lambda t: torch.sigmoid_(t),
                                lambda t: torch.tanh_(t), lambda t: F.selu(t, inplace=True)],
                         ids=["elu_", "leaky_relu_", "hardtanh_", "relu6_", "relu_", "sigmoid_", "tanh_", "selu_"])
def test_inplace_backward_from_result(fn, dtype):
    # In place on a non-leaf: elu and leaky_relu differentiate from their result.
    check_grad(lambda t: fn(t * 1), make(SHAPE, dtype))


def test_backward_ops_direct():
    g, x = make(SHAPE, seed=1), make(SHAPE, seed=2)
    for op, args in [(torch.ops.aten.threshold_backward, (g, x, 0.3)),
                     (torch.ops.aten.gelu_backward, (g, x)),
                     (torch.ops.aten.sigmoid_backward, (g, x.sigmoid())),
                     (torch.ops.aten.tanh_backward, (g, x.tanh())),
                     (torch.ops.aten.hardtanh_backward, (g, x, -0.5, 0.5)),
                     (torch.ops.aten.softplus_backward, (g, x, 3.0, 2.0)),
                     (torch.ops.aten.elu_backward, (g, 1.2, 1.1, 0.9, False, x)),
                     (torch.ops.aten.leaky_relu_backward, (g, x, 0.3, False))]:
        assert_same(op(*tpu(args)), op(*args))


def test_out_and_noncontiguous():
    x = make(SHAPE, noncontiguous=True)
    for fn in [F.elu, F.softplus, F.hardswish, F.mish, F.leaky_relu]:
        assert_same(fn(tpu(x)), fn(x))
    out = tpu(torch.empty(SHAPE))
    torch.ops.aten.hardtanh.out(tpu(x), -1.0, 0.5, out=out)
    assert_same(out, F.hardtanh(x, -1.0, 0.5))


def test_raises_like_cpu():
    x = make((3, 5))
    for fn, exc in [(lambda t: F.glu(t, -1), RuntimeError),  # odd halving dim
                    (lambda t: F.leaky_relu_(t * 1, -0.1).sum().backward(), RuntimeError)]:
        with pytest.raises(exc):
            fn(x.clone().requires_grad_())
        with pytest.raises(exc):
            fn(tpu(x).requires_grad_())


def test_silu_backward_bfloat16_as_cpus_kernel(no_cpu_fallback):
    # CPU's silu_backward computes in float32 and rounds once; the math
    # decomposition (PrivateUse1's default) rounded every step to bfloat16.
    x = torch.linspace(-6, 6, 241).to(torch.bfloat16)
    g = torch.linspace(-1, 1, 241).to(torch.bfloat16)
    expected = torch.ops.aten.silu_backward(g, x)
    got = torch.ops.aten.silu_backward(tpu(g), tpu(x))
    assert torch.equal(got.cpu(), expected)
    # Second order stays PyTorch's formula.
    xd = torch.randn(6, dtype=torch.float64, device="tpu", requires_grad=True)
    assert torch.autograd.gradgradcheck(torch.nn.functional.silu, (xd,))


def test_mish_backward_bfloat16_as_cpus_kernel(no_cpu_fallback):
    x = torch.linspace(-6, 6, 241).to(torch.bfloat16)
    g = torch.linspace(-1, 1, 241).to(torch.bfloat16)
    expected = torch.ops.aten.mish_backward(g, x)
    got = torch.ops.aten.mish_backward(tpu(g), tpu(x))
    assert_same(got, expected, rtol=0, atol=2 ** -8 * 2)  # within an ulp of CPU's (float32, rounded once)
    xd = torch.randn(6, dtype=torch.float64, device="tpu", requires_grad=True)
    assert torch.autograd.gradgradcheck(torch.nn.functional.mish, (xd,))


def test_threshold_inplace_on_an_expanded_tensor_as_cpu():
    # Every copy of an element computes the same value from the same input,
    # so CPU allows it (PyTorch's test_threshold_inplace_overlap); other
    # in-place ops on expanded tensors raise as on CPU.
    base = torch.randn(1, 6)
    x, xt = base.clone().expand(6, 6), base.to("tpu").expand(6, 6)
    F.threshold_(x, 0.5, 0.5)
    F.threshold_(xt, 0.5, 0.5)
    F.threshold(x, 0.2, -1.0, inplace=True)
    F.threshold(xt, 0.2, -1.0, inplace=True)
    assert torch.equal(xt.cpu(), x)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        torch.relu_(xt)


def test_silu_keeps_its_far_negative_tail():
    # x * sigmoid(x) flushed sigmoid's subnormal result below -87.3 (float32):
    # -0 where CPU's x / (1 + exp(-x)) gives -3e-37.
    x = torch.linspace(-88.7, -86.0, 28)
    got = torch.nn.functional.silu(x.to("tpu")).cpu()
    torch.testing.assert_close(got, torch.nn.functional.silu(x), rtol=1e-5, atol=0)
    assert (got < 0).all()
