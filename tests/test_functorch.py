"""torch.func transforms on tpu, each compared with the same transform on CPU."""
import pytest
import torch
from torch.func import grad, hessian, jacfwd, jacrev, jvp, linearize, vjp, vmap
from torch.utils._python_dispatch import TorchDispatchMode

import torch_pjrt  # noqa: F401
from conftest import assert_same, make, tpu


def f(x):
    return (x.sin() * x).sum()


def g(x):
    return torch.stack([x.exp().sum(), (x * x).prod()])


TRANSFORMS = {
    "grad": lambda x: grad(f)(x),
    "vjp": lambda x: vjp(g, x)[1](torch.ones(2, device=x.device, dtype=x.dtype))[0],
    "jvp": lambda x: jvp(g, (x,), (torch.ones_like(x),))[1],
    "jacrev": lambda x: jacrev(g)(x),
    "jacfwd": lambda x: jacfwd(g)(x),
    "hessian": lambda x: hessian(f)(x),
    "vmap_grad": lambda x: vmap(grad(f))(x.reshape(2, -1)),
    "linearize": lambda x: linearize(g, x)[1](torch.ones_like(x)),
    # grad of a linear function: its derivative is autograd's ZeroTensor.
    "linearize_grad_linear": lambda x: linearize(grad(lambda y: (y * 2).sum()), x)[1](torch.ones_like(x)),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_transform_matches_cpu(name):
    x = make((6,), dtype=torch.float64, low=-1, high=1)
    assert_same(TRANSFORMS[name](tpu(x)), TRANSFORMS[name](x))


def test_copy_from_a_zero_tensor():
    # A ZeroTensor has no data pointer; the copy writes zeros, as CPU's does.
    z = torch.ops.aten._efficientzerotensor([3, 2])
    dst = torch.full((3, 2), 7.0, device="tpu")
    assert_same(dst.copy_(z), torch.zeros(3, 2))
    assert_same(z.to("tpu"), torch.zeros(3, 2))


def test_copy_into_a_zero_tensor_raises_as_on_cpu():
    z = torch.ops.aten._efficientzerotensor([3])
    with pytest.raises(RuntimeError, match="ZeroTensors are immutable"):
        z.copy_(torch.ones(3, device="tpu"))


class Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_efficient_zeros_on_tpu_without_the_fallback(no_cpu_fallback):
    z = torch.ops.aten._efficientzerotensor([4], device="tpu", dtype=torch.float16)
    assert z.device.type == "tpu" and z.dtype == torch.float16
    assert_same(z, torch.zeros(4, dtype=torch.float16))
    with Passthrough():  # (crashed: the fallback's CPU ZeroTensor copied over)
        z = torch.ops.aten._efficientzerotensor([2, 3], device="tpu")
    assert_same(z + 1, torch.ones(2, 3))


def test_per_sample_gradients_through_attention():
    # vmap(grad(f)) over scaled_dot_product_attention: the tensors the kernel
    # choice sees are grad wrappers of batched ones; the fused op (no
    # batching rule) raised "Batching rule not implemented".
    import warnings
    torch.manual_seed(0)
    q, k = torch.randn(3, 2, 4, 8), torch.randn(2, 4, 8)

    def per_sample(q, k):
        f = lambda q: torch.nn.functional.scaled_dot_product_attention(q[None], k[None], k[None]).pow(2).sum()
        return vmap(grad(f))(q)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU's "performance drop" note about its own kernel
        expected = per_sample(q, k)
    torch.testing.assert_close(per_sample(tpu(q), tpu(k)).cpu(), expected, rtol=1e-5, atol=1e-5)
