"""complex64/complex128 on tpu against CPU: creation, copies, arithmetic with
complex and real operands, view_as_real/view_as_complex and .real/.imag views
(sharing storage), the lazy conj bit, abs/angle, matmul, reductions, torch.fft
(all transforms and norm modes) and complex autograd."""
import pytest
import torch

from conftest import assert_same, check_raises, tpu

COMPLEX = [torch.complex64, torch.complex128]


def cdata(shape, dt=torch.complex64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=dt, generator=g)


def rdata(shape, dt=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=dt, generator=g)


@pytest.mark.parametrize("dt", COMPLEX)
def test_creation_and_copies(dt):
    assert_same(torch.zeros(2, 3, dtype=dt, device="tpu"), torch.zeros(2, 3, dtype=dt))
    assert_same(torch.ones(4, dtype=dt, device="tpu"), torch.ones(4, dtype=dt))
    assert_same(torch.full((2, 2), 1 - 2j, dtype=dt, device="tpu"), torch.full((2, 2), 1 - 2j, dtype=dt))
    assert_same(torch.tensor([1 + 2j, -3j], dtype=dt, device="tpu"), torch.tensor([1 + 2j, -3j], dtype=dt))
    x = cdata((3, 4), dt)
    t = tpu(x)
    assert t.dtype == dt and torch.equal(t.cpu(), x)
    for other in COMPLEX + [torch.float32, torch.float64, torch.int64]:
        assert_same(t.to(other), x.to(other))
    r = rdata((3, 4))
    assert_same(tpu(r).to(dt), r.to(dt))
    assert_same(t[1:, ::2].clone(), x[1:, ::2].clone())
    assert_same(torch.cat([t, t]), torch.cat([x, x]))


BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "rsub": lambda a, b: 2 - a, "add_alpha": lambda a, b: torch.add(a, b, alpha=0.5),
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
}


@pytest.mark.parametrize("dt", COMPLEX)
@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("other", ["complex", "real", "int", "scalar", "cscalar"])
def test_binary(dt, op, other):
    a = cdata((3, 4), dt, 0)
    b = {"complex": cdata((3, 4), dt, 1), "real": rdata((4,), seed=2), "int": torch.arange(1, 5),
         "scalar": 2.5, "cscalar": 1.5 - 0.5j}[other]
    b_t = tpu(b) if isinstance(b, torch.Tensor) else b
    assert_same(BINARY[op](tpu(a), b_t), BINARY[op](a, b))
    if isinstance(b, torch.Tensor) and op in ("add", "mul", "div", "sub"):
        assert_same(BINARY[op](b_t, tpu(a)), BINARY[op](b, a))


UNARY = {
    "neg": torch.neg, "exp": torch.exp, "sqrt": torch.sqrt, "abs": torch.abs, "angle": torch.angle,
    "sgn": torch.sgn, "reciprocal": torch.reciprocal, "conj_physical": torch.conj_physical,
    "sum": torch.sum, "mean": torch.mean, "sum_dim": lambda x: x.sum(1), "mean_dim": lambda x: x.mean(0),
    "log": torch.log, "sin": torch.sin, "tanh": torch.tanh,
    "log1p": torch.log1p, "expm1": torch.expm1, "cos": torch.cos, "tan": torch.tan, "cosh": torch.cosh,
    "sinh": torch.sinh, "rsqrt": torch.rsqrt, "cumsum": lambda x: x.cumsum(1),
}
# Lowered on tpu for complex (no CPU fallback); the rest of UNARY may fall back.
ON_DEVICE = ["exp", "sqrt", "log", "log1p", "expm1", "cos", "sin", "tan", "tanh", "rsqrt", "cumsum", "neg", "abs"]


@pytest.mark.parametrize("dt", COMPLEX)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary(dt, op):
    x = cdata((3, 4), dt)
    x[0, 0] = 0
    tol = {"rtol": 1e-4, "atol": 1e-5} if dt == torch.complex64 else {}
    assert_same(UNARY[op](tpu(x)), UNARY[op](x), **tol)


@pytest.mark.parametrize("dt", COMPLEX)
@pytest.mark.parametrize("op", ON_DEVICE)
def test_unary_on_device(dt, op, no_cpu_fallback):
    x = cdata((3, 4), dt)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dt == torch.complex64 else {}
    assert_same(UNARY[op](tpu(x)), UNARY[op](x), **tol)


@pytest.mark.parametrize("dt", COMPLEX)
def test_abs_nan_and_inf_components(dt, no_cpu_fallback):
    # As CPU's hypot: inf when either part is infinite (even with a NaN), else
    # NaN when either part is NaN (abs(1e-3 + nan j) was finite).
    inf, nan = float("inf"), float("nan")
    re = [1e-3, nan, 3.0, inf, nan, -inf, nan, 0.0, -2.0, 1e-30, 0.0, -0.0]
    im = [nan, 2.0, 4.0, nan, -inf, 1.0, nan, -inf, nan, nan, 0.0, -0.0]
    rt = torch.float32 if dt == torch.complex64 else torch.float64
    z = torch.complex(torch.tensor(re, dtype=rt), torch.tensor(im, dtype=rt))
    assert_same(tpu(z).abs(), z.abs())
    assert_same(torch.abs(tpu(z)[::2]), torch.abs(z[::2]))


@pytest.mark.parametrize("dt", COMPLEX)
def test_abs_rounds_as_cpu(dt, no_cpu_fallback):
    # CPU takes hypot to half an ulp; XLA's complex abs was an ulp off for
    # about a third of complex128 values. Normal results are equal bit for
    # bit; wide and tiny magnitudes must neither overflow nor underflow.
    # (XLA:CPU flushes subnormal inputs and results to zero: none are here.
    # Within a few powers of ten of the smallest normal, CPU's hypot is the
    # one off: there the tpu values are the nearer to the exact ones.)
    rt = torch.float32 if dt == torch.complex64 else torch.float64
    big = 1e300 if dt == torch.complex128 else 1e36
    tiny = 1e-290 if dt == torch.complex128 else 1e-30
    z = torch.cat([cdata((20000,), dt) * 10, cdata((2000,), dt, seed=1) * big, cdata((2000,), dt, seed=2) * tiny,
                   torch.complex(rdata((2000,), rt, seed=3) * big, rdata((2000,), rt, seed=4) * tiny)])
    normal = (z.real.abs() >= torch.finfo(rt).tiny) & (z.imag.abs() >= torch.finfo(rt).tiny)
    z = z[normal & (z.abs() > torch.finfo(rt).tiny)]
    assert torch.equal(tpu(z).abs().cpu(), z.abs())


def test_inf_norm_backward_of_complex_finds_its_maximum(no_cpu_fallback):
    # The norm's backward masks |x| == norm: a norm from CPU's hypot and |x|
    # from XLA's abs differed by an ulp, no element matched, and the gradient
    # was NaN everywhere (PyTorch's test_ops_gradients, masked.normalize).
    x0 = torch.tensor([-3.0065 + 8.6689j, 5.1342 + 4.4325j, -7.7881 - 8.1430j, 7.5352 - 2.3287j,
                       5.9920 - 8.0785j], dtype=torch.complex128)
    for fn in [lambda x: torch.masked.normalize(x, float("inf"), 0),
               lambda x: torch.linalg.vector_norm(x, float("inf")),
               lambda x: torch.linalg.vector_norm(x, 2),
               lambda x: torch.linalg.vector_norm(x, 0.5),
               lambda x: torch.linalg.vector_norm(x.reshape(5, 1), 3, dim=0)]:
        grads = []
        for x in [x0.clone().requires_grad_(), tpu(x0).requires_grad_()]:
            y = fn(x)
            grads.append(torch.autograd.grad(y, x, torch.ones_like(y))[0])
        assert_same(grads[1], grads[0], rtol=1e-12, atol=1e-12)


def test_real_input_angle_and_complex():
    r = torch.tensor([-1.0, 0.0, 2.0, float("nan"), -0.0])
    assert_same(torch.angle(tpu(r)), torch.angle(r))
    a, b = rdata((3,), seed=1), rdata((3,), seed=2)
    assert_same(torch.complex(tpu(a), tpu(b)), torch.complex(a, b))
    assert_same(torch.complex(tpu(a.double()), tpu(b.double())), torch.complex(a.double(), b.double()))


@pytest.mark.parametrize("dt", COMPLEX)
def test_matmul(dt):
    a, b = cdata((3, 4), dt, 0), cdata((4, 5), dt, 1)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dt == torch.complex64 else {}
    assert_same(tpu(a) @ tpu(b), a @ b, **tol)
    ba, bb = cdata((2, 3, 4), dt, 2), cdata((2, 4, 2), dt, 3)
    assert_same(torch.bmm(tpu(ba), tpu(bb)), torch.bmm(ba, bb), **tol)
    v, w = cdata((4,), dt, 4), cdata((4,), dt, 5)
    assert_same(torch.dot(tpu(v), tpu(w)), torch.dot(v, w), **tol)
    assert_same(torch.vdot(tpu(v), tpu(w)), torch.vdot(v, w), **tol)
    check_raises(lambda x, y: x @ y, a, rdata((4, 5)))


@pytest.mark.parametrize("dt", COMPLEX)
def test_view_as_real_and_complex_share_storage(dt):
    x = cdata((3, 4), dt)
    t = tpu(x)
    vr, cvr = torch.view_as_real(t), torch.view_as_real(x)
    assert_same(vr, cvr)
    assert vr.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    vr[1, 2, 0] = 10.0
    cvr[1, 2, 0] = 10.0
    assert_same(t, x)
    r = rdata((5, 2), torch.float32 if dt == torch.complex64 else torch.float64)
    tr = tpu(r)
    vc, cvc = torch.view_as_complex(tr), torch.view_as_complex(r)
    assert_same(vc, cvc)
    vc[3] = 1 + 1j
    cvc[3] = 1 + 1j
    assert_same(tr, r)
    check_raises(lambda y: torch.view_as_complex(y), rdata((3, 3)))
    check_raises(lambda y: torch.view_as_real(y), rdata((3,)))


@pytest.mark.parametrize("dt", COMPLEX)
def test_real_imag_views_writable(dt):
    x = cdata((3, 4), dt)
    t = tpu(x)
    assert_same(t.real, x.real)
    assert_same(t.imag, x.imag)
    t.real[0] = 5.0
    x.real[0] = 5.0
    t.imag[:, 1] *= 2
    x.imag[:, 1] *= 2
    assert_same(t, x)
    t.imag.zero_()
    x.imag.zero_()
    assert_same(t, x)


@pytest.mark.parametrize("dt", COMPLEX)
def test_conj_bit(dt):
    x = cdata((3, 4), dt)
    t = tpu(x)
    c = t.conj()
    assert c.is_conj()
    assert_same(c, x.conj())
    assert torch.equal(c.cpu(), x.conj())
    assert_same(c.resolve_conj(), x.conj().resolve_conj())
    assert not c.resolve_conj().is_conj()
    assert_same(c.clone(), x.conj().clone())
    assert_same(c * tpu(x), x.conj() * x)
    assert_same(c.imag, x.conj().imag)  # a neg view
    assert_same(c.imag + 0, x.conj().imag + 0)
    assert_same(c.to(torch.complex128), x.conj().to(torch.complex128))
    assert_same(torch.view_as_real(c.resolve_conj()), torch.view_as_real(x.conj().resolve_conj()))
    # copies into a conj view and from CPU conj tensors
    d = tpu(torch.zeros(3, 4, dtype=dt)).conj()
    e = torch.zeros(3, 4, dtype=dt).conj()
    d.copy_(t)
    e.copy_(x)
    assert_same(d, e)
    assert_same(tpu(x.conj()), x.conj())
    u = tpu(torch.zeros(3, 4, dtype=dt))
    u.copy_(x.conj())
    assert_same(u, x.conj())
    check_raises(lambda y: torch.view_as_real(y.conj()), x)


FFTS = {  # name: (torch.fft function, kwargs), on a complex (3, 4, 5) input
    "fft": ("fft", {}), "fft_n": ("fft", {"n": 6, "dim": 0}), "fft_trim": ("fft", {"n": 3}),
    "ifft": ("ifft", {}), "fft2": ("fft2", {}), "ifft2": ("ifft2", {}), "fftn": ("fftn", {}),
    "fftn_dims": ("fftn", {"dim": (2, 0)}), "ifftn": ("ifftn", {"s": (4, 4), "dim": (0, 2)}),
    "irfft": ("irfft", {}), "irfft_n": ("irfft", {"n": 9}), "irfft2": ("irfft2", {}),
    "irfftn": ("irfftn", {"s": (3, 4, 6)}), "irfftn_dim": ("irfftn", {"dim": (0, 1)}), "hfft": ("hfft", {}),
}
RFFTS = {  # on a real (3, 4, 5) input
    "rfft": ("rfft", {}), "rfft_n": ("rfft", {"n": 7, "dim": 1}), "rfft2": ("rfft2", {}),
    "rfftn": ("rfftn", {}), "rfftn_dims": ("rfftn", {"dim": (2, 0)}), "fft_real": ("fft", {}),
    "fft2_real": ("fft2", {"dim": (0, 2)}), "ihfft": ("ihfft", {}),
}


def fft_tol(dt):
    return {"rtol": 1e-4, "atol": 1e-4} if dt in (torch.complex64, torch.float32) else {"rtol": 1e-9, "atol": 1e-9}


def fft_call(spec, norm):
    name, kwargs = spec
    kw = dict(kwargs) if norm is None else dict(kwargs, norm=norm)
    return lambda x: getattr(torch.fft, name)(x, **kw)


@pytest.mark.parametrize("dt", COMPLEX)
@pytest.mark.parametrize("norm", [None, "forward", "ortho", "backward"])
@pytest.mark.parametrize("op", list(FFTS))
def test_fft_complex_input(dt, norm, op):
    x = cdata((3, 4, 5), dt)
    f = fft_call(FFTS[op], norm)
    assert_same(f(tpu(x)), f(x), **fft_tol(dt))


@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
@pytest.mark.parametrize("norm", [None, "forward", "ortho"])
@pytest.mark.parametrize("op", list(RFFTS))
def test_fft_real_input(dt, norm, op):
    x = rdata((3, 4, 5), dt)
    f = fft_call(RFFTS[op], norm)
    assert_same(f(tpu(x)), f(x), **fft_tol(dt))


def test_fft_more_than_three_dims():
    x = cdata((2, 3, 2, 4, 3))
    assert_same(torch.fft.fftn(tpu(x)), torch.fft.fftn(x), **fft_tol(torch.complex64))
    assert_same(torch.fft.ifftn(tpu(x), norm="ortho"), torch.fft.ifftn(x, norm="ortho"), **fft_tol(torch.complex64))
    r = rdata((2, 3, 2, 4, 3))
    assert_same(torch.fft.rfftn(tpu(r)), torch.fft.rfftn(r), **fft_tol(torch.complex64))
    assert_same(torch.fft.irfftn(tpu(x)), torch.fft.irfftn(x), **fft_tol(torch.complex64))


def test_fft_runs_on_device(no_cpu_fallback):
    x = tpu(cdata((4, 6)))
    torch.fft.fft(x).cpu()
    torch.fft.ifft2(x, norm="ortho").cpu()
    torch.fft.irfft(x).cpu()
    torch.fft.rfft(tpu(rdata((4, 6)))).cpu()


def test_complex_ops_run_on_device(no_cpu_fallback):
    a, b = tpu(cdata((3, 4), seed=0)), tpu(cdata((4, 3), seed=1))
    for y in [a + a, a * a, a / a, -a, a.exp(), a.abs(), a.angle(), a @ b, a.sum(), a.mean(), a.conj().cpu(),
              a.real + 1, torch.view_as_real(a) * 2]:
        y.cpu()


def test_more_ops_run_on_device(no_cpu_fallback):
    a, m = cdata((5,), seed=0), cdata((3, 5), seed=1)
    r = rdata((5,), seed=2)
    tol = {"rtol": 1e-4, "atol": 1e-5}
    assert_same(tpu(m) @ tpu(a), m @ a, **tol)
    assert_same(torch.vdot(tpu(a), tpu(a * 2)), torch.vdot(a, a * 2), **tol)
    assert_same(torch.polar(tpu(r.abs()), tpu(r)), torch.polar(r.abs(), r), **tol)
    assert_same(torch.fft.fft(tpu(a), n=8), torch.fft.fft(a, n=8), **tol)
    assert_same(torch.fft.fftshift(tpu(m)), torch.fft.fftshift(m))
    assert_same(torch.addmm(tpu(m[:, :3]), tpu(m), tpu(m.T)), torch.addmm(m[:, :3], m, m.T), **tol)


def test_fft_errors_as_cpu():
    check_raises(lambda x: torch.fft.fft(x, dim=3), cdata((3, 4)))
    check_raises(lambda x: torch.fft.fft(x, n=0), cdata((3, 4)))
    check_raises(lambda x: torch.fft.fft2(x.half()), rdata((4, 4)))


def grads(fn, x, device):
    t = x.detach().to(device).requires_grad_(True)
    fn(t).backward()
    return t.grad


@pytest.mark.parametrize("case", [
    lambda z: z.abs().sum(),
    lambda z: (z * z.conj()).real.sum(),
    lambda z: torch.fft.fft(z).abs().sum(),
    lambda z: torch.fft.ifft2(z, norm="ortho").real.sum(),
    lambda z: (z.exp() * 2).imag.sum(),
    lambda z: torch.view_as_real(z).pow(2).sum(),
])
def test_complex_autograd(case):
    x = cdata((3, 4))
    assert_same(grads(case, x, "tpu"), grads(case, x, "cpu"), rtol=1e-4, atol=1e-5)


def test_real_to_complex_autograd():
    r = rdata((4, 6))
    f = lambda y: torch.fft.rfft(y).abs().sum()  # noqa: E731
    assert_same(grads(f, r, "tpu"), grads(f, r, "cpu"), rtol=1e-4, atol=1e-4)
    f2 = lambda y: torch.fft.irfft(torch.complex(y, y * 0.5)).pow(2).sum()  # noqa: E731
    assert_same(grads(f2, r, "tpu"), grads(f2, r, "cpu"), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("src,dst", [(torch.complex64, torch.float32), (torch.float32, torch.complex64),
                                     (torch.complex128, torch.float64), (torch.complex64, torch.int64),
                                     (torch.complex64, torch.uint8), (torch.uint8, torch.complex64),
                                     (torch.complex128, torch.complex64), (torch.int32, torch.complex64),
                                     (torch.complex64, torch.uint16)])
def test_view_dtype(src, dst):
    x = cdata((2, 4), torch.complex128) if src.is_complex else rdata((2, 8), torch.float64)
    if src.is_complex:
        x = x.to(src)
    else:
        x = x.to(src) if src.is_floating_point else (x * 50).to(src)
    t = tpu(x)
    assert_same(t.view(dst), x.view(dst))
    v, cv = t.view(dst), x.view(dst)
    v[0, 0] = 3
    cv[0, 0] = 3
    assert_same(t, x)


def test_nan_to_num_replaces_each_part(no_cpu_fallback):
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([complex(nan, inf), complex(-inf, 2.0), complex(1.0, -inf), complex(3.0, nan)],
                     dtype=torch.complex64)
    for kw in [{}, dict(nan=1.0, posinf=5.0, neginf=-7.0)]:
        assert torch.equal(torch.nan_to_num(x.to("tpu"), **kw).cpu(), torch.nan_to_num(x, **kw))


SPECIAL = [0, 1, -2.5, float("inf"), -float("inf"), float("nan"), 1e-30]


@pytest.mark.parametrize("dt", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("name,fn", [
    ("isnan", torch.isnan), ("isinf", torch.isinf), ("isfinite", torch.isfinite),
    ("all_dim", lambda t: t.view(7, 7).all(1)), ("any_dim", lambda t: t.view(7, 7).any(0)),
    ("all", torch.all), ("any", torch.any), ("count_nonzero", lambda t: torch.count_nonzero(t.view(7, 7), 1)),
    ("masked_fill", lambda t: t.masked_fill(t.real > 0, 3)), ("prod_dim", lambda t: t.view(7, 7)[:, :3].prod(1)),
])
def test_predicates_and_reductions_on_device(dt, name, fn, no_cpu_fallback):
    # Every pair of special parts: a part that is NaN or inf decides, as on CPU
    # (a convert to bool would look at the real part only).
    z = torch.tensor([complex(a, b) for a in SPECIAL for b in SPECIAL], dtype=dt)
    want, got = fn(z), fn(tpu(z))
    if want.dtype in (torch.bool, torch.int64):
        assert torch.equal(got.cpu(), want)
    else:
        assert_same(got, want)


@pytest.mark.parametrize("dt", [torch.int64, torch.float32])
def test_complex_fill_value_of_a_real_tensor_raises_as_cpu(dt):
    # (masked_fill runs complex tensors on the device; a complex value for a
    # real tensor keeps CPU's overflow error, not a silent real part)
    for dev in ("cpu", "tpu"):
        x = torch.zeros(2, dtype=dt, device=dev)
        with pytest.raises(RuntimeError, match="value cannot be converted to type .* without overflow"):
            x.masked_fill(torch.tensor(True, device=dev), torch.tensor(1j, device=dev))


# Python complex numbers and 0-d complex CPU tensors mixed with tpu tensors:
# runtime inputs of the program (no CPU fallback), in strict and fused eager.
SCALAR_OPS = {
    "mul": lambda x, s: x * s, "rmul": lambda x, s: s * x, "add": lambda x, s: x + s, "rsub": lambda x, s: s - x,
    "div": lambda x, s: x / s, "rdiv": lambda x, s: s / x, "eq": lambda x, s: x == s, "ne": lambda x, s: x != s,
    "add_": lambda x, s: x.clone().add_(s), "fill_": lambda x, s: x.clone().fill_(s),
    "where": lambda x, s: torch.where(x.real > 0, x, s), "masked_fill": lambda x, s: x.masked_fill(x.real > 0, s),
    "full": lambda x, s: torch.full((2, 3), s, device=x.device) + x,
}


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.int64, torch.complex64, torch.complex128])
@pytest.mark.parametrize("op", sorted(SCALAR_OPS))
def test_complex_scalars_run_on_device(op, dt, mode, no_cpu_fallback):
    import torch_pjrt
    f = SCALAR_OPS[op]
    x = (rdata((2, 3)) * 3).to(dt) if not dt.is_complex else cdata((2, 3), dt)
    real_into = op in ("add_", "fill_", "masked_fill") and not dt.is_complex  # CPU raises: no complex into real
    if real_into:
        return
    for s in [1j, 1.5 - 2j, torch.tensor(2 + 1j), torch.tensor(1 - 1j, dtype=torch.complex128)]:
        expected = f(x, s)
        if mode == "fused":
            with torch_pjrt.fused():
                got = f(tpu(x), s)
        else:
            got = f(tpu(x), s)
        tol = {"rtol": 1e-2, "atol": 1e-2} if dt == torch.bfloat16 else {}
        assert_same(got, expected, **tol)


@pytest.mark.parametrize("dt", COMPLEX)
def test_complex_normal_draws_each_part_with_half_the_variance(dt, no_cpu_fallback):
    """randn and normal_(mean, std) of complex tensors, drawn on the device:
    as on CPU, the real and imaginary parts each have std / sqrt(2), and the
    mean is added to both (200,000 draws: the moments within 0.01)."""
    torch.manual_seed(0)
    z = torch.randn(200_000, dtype=dt, device="tpu").cpu()
    assert z.dtype == dt
    for part in (z.real, z.imag):
        assert abs(part.mean().item()) < 0.01 and abs(part.std().item() - 0.5 ** 0.5) < 0.01
    assert abs((z.real * z.imag).mean().item()) < 0.01  # independent parts
    w = torch.empty(200_000, dtype=dt, device="tpu").normal_(2.0, 3.0).cpu()
    for part in (w.real, w.imag):
        assert abs(part.mean().item() - 2.0) < 0.03 and abs(part.std().item() - 3.0 * 0.5 ** 0.5) < 0.02


COMPLEX_ON_DEVICE = {
    "index": lambda z, i: z[i], "index_2d": lambda z, i: z[i[:2], i[1:]], "bool_mask": lambda z, i: z[z.real > 0],
    "index_put": lambda z, i: z.index_put((i,), z[:3] * 2), "index_put_acc": lambda z, i: z.index_put((i,), z[:3], True),
    "setitem": lambda z, i: z.clone().index_put_((i,), torch.tensor(1j, dtype=z.dtype)),
    "gather": lambda z, i: z.gather(1, i[:, None].expand(3, 2)), "scatter": lambda z, i: z.scatter(0, i[:, None].expand(3, 4), z[:3]),
    "scatter_add": lambda z, i: z.scatter(0, i[:, None].expand(3, 4), z[:3], reduce="add"),
    "take": lambda z, i: z.take(i), "tril": lambda z, i: z.tril(-1), "triu": lambda z, i: z.triu(1), "trace": lambda z, i: torch.trace(z),
    "addcmul": lambda z, i: torch.addcmul(z, z, z.flip(0), value=0.7), "lerp": lambda z, i: torch.lerp(z, z.flip(1), 0.3),
    "lerp_tensor": lambda z, i: torch.lerp(z, z.flip(1), z * 0.5),
    "square": lambda z, i: z ** 2, "cube": lambda z, i: z ** 3, "pow_2.5": lambda z, i: z ** 2.5, "reciprocal_pow": lambda z, i: z ** -1,
    "sqrt_pow": lambda z, i: z ** 0.5, "pow_tensor": lambda z, i: z ** z.flip(0),
}


@pytest.mark.parametrize("dt", COMPLEX)
@pytest.mark.parametrize("name", sorted(COMPLEX_ON_DEVICE))
def test_more_complex_ops_run_on_device(name, dt, no_cpu_fallback):
    """Indexing, scatters, triangles and pow on complex tensors run on the
    device (they ran on the CPU), equal to CPU (pow within 4 ulps: XLA's
    complex power and CPU's std::pow round differently)."""
    f = COMPLEX_ON_DEVICE[name]
    z, i = cdata((4, 4), dt), torch.tensor([0, 2, 3])
    eps = torch.finfo(torch.float32 if dt == torch.complex64 else torch.float64).eps
    assert_same(f(tpu(z), tpu(i)), f(z, i), rtol=4 * eps, atol=4 * eps)


# Ops whose complex inputs ran on the CPU fallback until session 56, each
# equal to CPU within a few ulps of the part type on the device.
COMPLEX_ON_DEVICE_2 = {
    "index_add": lambda z, i: z.index_add(0, i, z[:3] * 2), "index_copy": lambda z, i: z.index_copy(0, i, z[1:]),
    "index_fill": lambda z, i: z.index_fill(1, i, 1.5 - 2j), "scatter_add": lambda z, i: z.scatter_add(0, i[:, None].expand(3, 4), z[:3]),
    "masked_scatter": lambda z, i: z.masked_scatter(z.real > 0, z.flip(0) * 3), "put": lambda z, i: z.put(i, z[0, :3], accumulate=True),
    "nonzero_static": lambda z, i: torch.nonzero_static(z * (z.real > 0), size=20),
    "eye": lambda z, i: torch.eye(3, 5, dtype=z.dtype, device=z.device) * z[0, 0],
    "channel_shuffle": lambda z, i: torch.nn.functional.channel_shuffle(z.reshape(1, 4, 2, 2), 2),
    "unfold": lambda z, i: torch.nn.functional.unfold(z.reshape(1, 1, 4, 4), 2),
    "pad_reflect": lambda z, i: torch.nn.functional.pad(z[None], (2, 1), mode="reflect"),
    "pad_replicate": lambda z, i: torch.nn.functional.pad(z[None, None], (1, 2, 2, 1), mode="replicate"),
    "logical_and": lambda z, i: torch.logical_and(z, z * (z.imag > 0)), "logical_or": lambda z, i: torch.logical_or(z * 0, z),
    "logical_xor": lambda z, i: torch.logical_xor(z, z * (z.real > 0)), "logical_not": lambda z, i: torch.logical_not(z * (z.real > 0)),
    "cumprod": lambda z, i: torch.cumprod(z, 1), "addcdiv": lambda z, i: torch.addcdiv(z, z.flip(0), z + 3, value=0.5),
    # (real ends: complex ends are complex CPU scalars, which run on the CPU)
    "linspace": lambda z, i: torch.linspace(-2.0, 3.5, 7, dtype=z.dtype, device=z.device),
    "logspace": lambda z, i: torch.logspace(0.5, -1, 6, dtype=z.dtype, device=z.device),
    "var": lambda z, i: torch.var(z, 1), "std_all": lambda z, i: torch.std(z, correction=0),
    "var_mean": lambda z, i: torch.var_mean(z, 0, keepdim=True), "std_mean": lambda z, i: torch.std_mean(z, (0, 1)),
    "sigmoid": lambda z, i: torch.sigmoid(z), "silu": lambda z, i: torch.nn.functional.silu(z),
    "exp2": lambda z, i: torch.exp2(z), "log2": lambda z, i: torch.log2(z), "log10": lambda z, i: torch.log10(z),
    "sinc": lambda z, i: torch.sinc(z), "logaddexp": lambda z, i: torch.logaddexp(z, z.flip(1)),
    "cross": lambda z, i: torch.linalg.cross(z[:, :3], z.flip(0)[:, :3]), "renorm": lambda z, i: torch.renorm(z, 2, 0, 1.0),
    **{f: (lambda f: lambda z, i: getattr(torch, f)(z))(f) for f in ("acos", "asin", "atan", "acosh", "asinh", "atanh")},
}


@pytest.mark.parametrize("dt", COMPLEX)
@pytest.mark.parametrize("name", sorted(COMPLEX_ON_DEVICE_2))
def test_complex_ops_that_fell_back_run_on_device(name, dt, no_cpu_fallback):
    f = COMPLEX_ON_DEVICE_2[name]
    z, i = cdata((4, 4), dt), torch.tensor([0, 2, 3])
    eps = torch.finfo(torch.float32 if dt == torch.complex64 else torch.float64).eps
    assert_same(f(tpu(z), tpu(i)), f(z, i), rtol=8 * eps, atol=8 * eps)


def small_and_large_parts(dt, n=600):
    """Complex values with one part tiny (1e-9 .. 1e-30) or of any magnitude
    up to 30: where XLA's complex sin/cos/sinh/cosh lost the small part."""
    rdt = torch.float32 if dt == torch.complex64 else torch.float64
    g = torch.Generator().manual_seed(3)
    big = torch.randn(n, dtype=rdt, generator=g) * 3
    tiny = torch.randn(n, dtype=rdt, generator=g) * torch.logspace(-30, -9, n, dtype=rdt)
    mag = torch.logspace(-12, 1.4, n, dtype=rdt)
    ang = torch.rand(n, dtype=rdt, generator=g) * 6.3
    return torch.cat([torch.complex(big, tiny), torch.complex(tiny, big), torch.polar(mag, ang)])


@pytest.mark.parametrize("dt", COMPLEX)
@pytest.mark.parametrize("op", ["sin", "cos", "sinh", "cosh", "sinc", "tan", "tanh", "exp2", "log2", "log10",
                                "acos", "asin", "atan", "acosh", "asinh", "atanh"])
def test_complex_functions_keep_small_parts(op, dt, no_cpu_fallback):
    """Each part within 8 ulps (relative to |f(z)|) of CPU's. XLA's own complex
    sin gave sin(1e-8j) = 0 and sinh(1e-12 - 5e-13j) a real part of 0."""
    z = small_and_large_parts(dt)
    f = getattr(torch, op)
    want, got = f(z), f(tpu(z)).cpu()
    eps = torch.finfo(torch.float32 if dt == torch.complex64 else torch.float64).eps
    scale = want.abs().clamp_min(torch.finfo(z.real.dtype).tiny)
    err = torch.maximum((got.real - want.real).abs(), (got.imag - want.imag).abs()) / scale
    assert float(err.max()) <= 8 * eps, (op, complex(z[err.argmax()]), complex(want[err.argmax()]), complex(got[err.argmax()]))


@pytest.mark.parametrize("dt", COMPLEX)
def test_complex_branch_cuts_follow_signed_zeros(dt, no_cpu_fallback):
    """On a branch cut the side comes from the sign of a zero part, as C99 and
    CPU have it: asin(1.5 - 0j) is pi/2 - 0.96j, asinh(-0 + 2j) is -1.32 + pi/2 j."""
    vals = [1.5 - 0j, 1.5 + 0j, -2 - 0j, -2 + 0j, complex(-0.0, 1.5), complex(0.0, 1.5), complex(-0.0, -3.0),
            complex(0.0, -3.0), -0j, complex(-0.0, -0.0), 0.5 - 0j]
    z = torch.tensor(vals, dtype=dt)
    for op in ("acos", "asin", "atan", "acosh", "asinh", "atanh"):
        f = getattr(torch, op)
        want, got = f(z), f(tpu(z)).cpu()
        # (the non-zero part's sign is the side; a zero part's sign CPU's own formulas vary on)
        torch.testing.assert_close(got, want, rtol=4e-7, atol=1e-7, equal_nan=True, msg=op)


@pytest.mark.parametrize("dt", COMPLEX)
def test_complex_zero_parts_kept_beside_overflow(dt, no_cpu_fallback):
    """A zero part stays an exact zero where the other factor overflows, as
    glibc's csinh/ccosh give it (inf * 0 would be NaN)."""
    z = torch.tensor([1e4 + 0j, -1e4 - 0j, 1e4j, complex(0.0, -1e4), complex(-0.0, 1e4), 0j], dtype=dt)
    for op in ("sin", "cos", "sinh", "cosh"):
        f = getattr(torch, op)
        want, got = f(z), f(tpu(z)).cpu()
        torch.testing.assert_close(got, want, equal_nan=True, msg=op)
        assert torch.equal(got.imag.signbit(), want.imag.signbit()) and torch.equal(got.real.signbit(), want.real.signbit()), op
    assert torch.equal(torch.log2(tpu(torch.zeros(2, dtype=dt))).cpu(), torch.log2(torch.zeros(2, dtype=dt)))


@pytest.mark.parametrize("dt", COMPLEX)
def test_complex_logaddexp_special_values_as_cpu(dt, no_cpu_fallback):
    """CPU's complex logaddexp: min/max by real part, NaN infectious, both
    real parts -inf give the min, +inf give log(e^min + e^max)."""
    inf, nan = float("inf"), float("nan")
    a = torch.tensor([complex(-inf, 1), complex(inf, 0), complex(nan, 0), complex(0, nan), 1 + 2j, complex(-inf, 0.5), 3 + 0j],
                     dtype=dt)
    b = torch.tensor([complex(-inf, 2), complex(inf, 0), 1 + 1j, 2 + 0j, 1 - 2j, 0j, complex(nan, 1)], dtype=dt)
    torch.testing.assert_close(torch.logaddexp(tpu(a), tpu(b)).cpu(), torch.logaddexp(a, b), equal_nan=True)


@pytest.mark.parametrize("dt", COMPLEX)
def test_complex_exp_sqrt_pow_special_values_as_cpu(dt, no_cpu_fallback):
    """C99's (glibc's) values, which CPU gives: exp(-inf + inf j) is 0 and
    exp(inf + NaN j) inf + NaN j (XLA's were NaN + NaN j); sqrt(-4 - 0j) is
    -2j (XLA's +2j, a finite wrong value); 0 ** y is 0 for Re y > 0 (XLA's
    NaN) and 0 ** 0j NaN (XLA's 1)."""
    inf, nan = float("inf"), float("nan")
    z = torch.tensor([complex(inf, inf), complex(-inf, inf), complex(inf, nan), complex(-inf, nan), complex(inf, -inf),
                      complex(-inf, -inf), complex(inf, 0), complex(-inf, 0.5), complex(nan, 0), complex(1, inf),
                      complex(1e4, 0), complex(-1e4, 0.3), 1 + 2j], dtype=dt)
    for f in (torch.exp, torch.exp2):
        torch.testing.assert_close(f(tpu(z)).cpu(), f(z), equal_nan=True)
    s = torch.tensor([complex(-4, -0.0), complex(-4, 0.0), complex(-1, -0.0), 3 - 4j, complex(0, -0.0)], dtype=dt)
    got, want = torch.sqrt(tpu(s)).cpu(), torch.sqrt(s)
    torch.testing.assert_close(got, want)
    assert torch.equal(got.imag.signbit(), want.imag.signbit())
    x = torch.tensor([0j, 0j, 0j, 1 + 1j, -2 + 0.5j, 3j, 0j], dtype=dt)
    y = torch.tensor([2.5 - 0.5j, 0.7 + 0.2j, 0j, 0.5 + 0.25j, 2 + 0j, -1.5j, -1 + 0j], dtype=dt)
    torch.testing.assert_close(torch.pow(tpu(x), tpu(y)).cpu(), torch.pow(x, y), equal_nan=True)
    torch.testing.assert_close(torch.pow(0, tpu(y)).cpu(), torch.pow(0, y), equal_nan=True)


@pytest.mark.parametrize("dt", COMPLEX)
def test_complex_var_std_into_a_complex_out(dt, no_cpu_fallback):
    """CPU writes var/std of a complex tensor into a complex out= tensor (the
    program's complex of complex parts did not compile)."""
    x = cdata((3, 4), dt)
    for f in (torch.var, torch.std):
        want = f(x, 1, out=torch.empty(0, dtype=dt))
        got = f(tpu(x), 1, out=torch.empty(0, dtype=dt, device="tpu"))
        assert_same(got, want)
