"""torch.compile(backend="tpu") on complex values and dtype-changing views,
against the same functions run by PyTorch on CPU: lazy conjugate and negative
views (which compiled graphs once read as plain views: z.conj() * 2 gave
2 * z), view_as_real / view_as_complex / .real / .imag and .view(dtype) in
graphs (which raised), Python complex numbers in graphs (which raised), and
the complex rotary embedding of Meta's Llama with its gradient. float32
tolerances rtol/atol 1e-5, gradients 1e-4."""
import pytest
import torch

import torch_pjrt  # noqa: F401


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _resolved(t):
    return t.cpu().resolve_conj().resolve_neg()


def _check(f, *inputs, grad=False, atol=1e-5):
    """f compiled on tpu copies against f on CPU: results, inputs (mutated
    alike) and, with grad, the inputs' gradients of sum(|result|^2)."""
    cpu = [x.clone().requires_grad_(grad and x.is_floating_point()) for x in inputs]
    dev = [x.to("tpu").requires_grad_(grad and x.is_floating_point()) for x in inputs]
    expected, got = f(*cpu), torch.compile(f, backend="tpu")(*dev)
    assert got.device.type == "tpu" and got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(_resolved(got), _resolved(expected), rtol=atol, atol=atol)
    for c, d in zip(cpu, dev):
        torch.testing.assert_close(_resolved(d.detach()), _resolved(c.detach()), rtol=atol, atol=atol)
    if grad:
        expected.abs().pow(2).sum().backward()
        got.abs().pow(2).sum().backward()
        for c, d in zip(cpu, dev):
            if c.requires_grad:
                torch.testing.assert_close(d.grad.cpu(), c.grad, rtol=1e-4, atol=1e-4)


def _z(*shape, dt=torch.complex64, seed=0):
    return torch.randn(*shape, dtype=dt, generator=torch.Generator().manual_seed(seed))


def _zero_imag(z):
    torch.view_as_real(z)[..., 1].zero_()
    return z * 1


def _scale_real(z):
    z.real.mul_(2)
    return z.imag.clone()


def _conj_add_(z):
    y = z.conj()
    y.add_(1j)
    return y.clone()


LAZY = {
    "conj_mul": lambda z: z.conj() * 2,
    "conj_clone": lambda z: z.conj().clone(),
    "z_times_conj": lambda z: z * z.conj(),
    "conj_matmul": lambda z: z @ z.conj().T,
    "adjoint_matmul": lambda z: z.mH @ z,
    "vdot": lambda z: torch.vdot(z[0], z[1]),
    "conj_cat": lambda z: torch.cat([z, z.conj()]),
    "imag_of_conj": lambda z: z.conj().imag + z.imag,
    "neg_view": lambda z: z._neg_view().clone(),
    "returned_conj_view": lambda z: z.conj().t(),
    "conj_add_": _conj_add_,
}


@pytest.mark.parametrize("name", sorted(LAZY))
def test_lazy_conj_and_neg_views(name):
    _check(LAZY[name], _z(3, 3))


DTYPE_VIEWS = {
    "real": (lambda z: z.real * 2, _z(5)),
    "imag_of_transpose": (lambda z: z.t().imag + 1, _z(3, 4)),
    "real_of_slice": (lambda z: z[2:].real * 3, _z(6)),
    "view_as_real": (lambda z: torch.view_as_real(z) * 2, _z(2, 3, dt=torch.complex128)),
    "view_as_complex_of_slice": (lambda x: torch.view_as_complex(x[2:].reshape(-1, 2)) * 2, torch.randn(14)),
    "zero_imag_in_place": (_zero_imag, _z(5, dt=torch.complex128)),
    "scale_real_in_place": (_scale_real, _z(5)),
    "float_bits": (lambda x: x.view(torch.int32) & 0x7FFFFFFF, torch.randn(6)),
    "bytes_of_slice": (lambda x: x[1:].view(torch.uint8).to(torch.int32) + 1, torch.randn(4, 3)),
    "int16_of_slice": (lambda x: x[1:].view(torch.int16) * 2, torch.randn(5, 4)),
    "float_from_bytes": (lambda x: (x + 1).view(torch.float32), torch.randint(0, 60, (3, 8), dtype=torch.int8)),
}


@pytest.mark.parametrize("name", sorted(DTYPE_VIEWS))
def test_views_changing_the_dtype(name):
    f, x = DTYPE_VIEWS[name]
    _check(f, x)


@pytest.mark.parametrize("s", [1j, 1.5 - 2j])
@pytest.mark.parametrize("dt", [torch.float32, torch.complex64, torch.complex128])
def test_python_complex_numbers(s, dt):
    x = torch.randn(5).to(dt)
    for f in (lambda x: x * s, lambda x: s / (x + 3), lambda x: torch.exp(x * s),
              lambda x: torch.full((5,), s, device=x.device) - x, lambda x: torch.where(x.real > 0, x, s)):
        torch._dynamo.reset()
        _check(f, x)


def _rope(xq, freqs):
    """Meta's Llama rotary embedding: pairs as complex numbers times unit phases."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    return torch.view_as_real(xq_ * freqs).flatten(-2).type_as(xq)


def test_complex_rotary_embedding_and_its_gradient():
    angles = torch.outer(torch.arange(8.0), 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8))
    freqs = torch.polar(torch.ones(8, 4), angles)[:, None, :]
    _check(lambda x: _rope(x, freqs.to(x.device)), torch.randn(2, 8, 3, 8), grad=True)


@pytest.mark.parametrize("name,f", [
    ("view_as_real_of_slice", lambda z: torch.view_as_real(z[1:])),
    ("real", lambda z: z.real),
    ("imag_of_transpose", lambda z: z.t().imag),
    ("int_bits_of_real", lambda z: z.real.view(torch.int32)),
])
def test_returned_views_of_an_input_in_another_dtype_alias_it(name, f):
    """A returned view of an input that changes the dtype comes back as a view
    of the input's storage (it raised: the view was rebuilt in the input's
    dtype), with CPU's sizes, strides and offset; writing it writes the input."""
    z = _z(3, 4)
    zt = z.to("tpu")
    expected, got = f(z), torch.compile(f, backend="tpu")(zt)
    assert got.dtype == expected.dtype and got.stride() == expected.stride()
    assert got.storage_offset() == expected.storage_offset() and torch.equal(got.cpu(), expected)
    got.zero_()
    expected.zero_()
    assert torch.equal(zt.cpu(), z)
