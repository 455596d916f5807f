"""out= tensors of nonzero and of ops that run through the CPU fallback: the
out tensor's device is checked (PyTorch's same-device error, as CUDA raises
it), a correctly sized out= tensor keeps its strides, and a wrongly sized one
is resized by CPU's rules (with CPU's warning), taking the strides CPU gives."""
import warnings

import pytest
import torch

import torch_pjrt
from conftest import assert_same, make, tpu

RESIZED = "An output with one or more elements was resized"


def run_out(fn, x, out):
    """fn(x, out) with the warnings it gave about resizing the output."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = fn(x, out)
    return r, [str(e.message) for e in w if RESIZED in str(e.message)]


def compare_out(fn, x, out, check_strides=True):
    """fn(x, out) on CPU and tpu: values, sizes, strides, the result is out, the same resize warnings."""
    cpu_out, tpu_out = out.clone() if out.is_contiguous() else out, tpu(out)
    if not out.is_contiguous():
        # the same non-contiguous layout on both sides
        cpu_out = torch.empty_strided(out.size(), out.stride(), dtype=out.dtype).copy_(out)
        tpu_out = torch.empty_strided(out.size(), out.stride(), dtype=out.dtype, device="tpu").copy_(out)
    r_cpu, w_cpu = run_out(fn, x, cpu_out)
    r_tpu, w_tpu = run_out(fn, tpu(x), tpu_out)
    assert r_tpu is tpu_out or r_tpu.data_ptr() == tpu_out.data_ptr()
    assert_same(tpu_out, cpu_out)
    assert tpu_out.shape == cpu_out.shape
    if check_strides:
        assert tpu_out.stride() == cpu_out.stride(), (tpu_out.stride(), cpu_out.stride())
    assert len(w_tpu) == len(w_cpu), (w_tpu, w_cpu)


def nonzero_out(x, out):
    return torch.nonzero(x, out=out)


X = make((3, 3), seed=1).masked_fill(make((3, 3), torch.bool, seed=2), 0)
NNZ = int((X != 0).sum())


@pytest.mark.parametrize("out", [
    torch.zeros(NNZ, 2, dtype=torch.long),                     # right size, contiguous
    torch.zeros(2, NNZ, dtype=torch.long).t(),                 # right size, transposed
    torch.zeros(NNZ + 2, 2, dtype=torch.long),                 # wrong size: resized, warns
    torch.zeros(0, dtype=torch.long),                          # empty: resized, no warning
], ids=["contiguous", "transposed", "wrong_size", "empty"])
def test_nonzero_out(out, metrics_delta):
    compare_out(nonzero_out, X, out)
    assert not metrics_delta()["cpu_fallbacks"]  # nonzero is a host op, not a fallback


def test_nonzero_out_strided_view():
    base_cpu = torch.full((NNZ, 4), -1, dtype=torch.long)
    base_tpu = tpu(base_cpu)
    torch.nonzero(X, out=base_cpu[:, 1:3])
    torch.nonzero(tpu(X), out=base_tpu[:, 1:3])
    assert_same(base_tpu, base_cpu)


def test_nonzero_out_errors():
    # CUDA: "Expected all tensors to be on the same device, but got out is on cpu, ..."
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but got out is on cpu"):
        torch.nonzero(tpu(X), out=torch.empty(0, dtype=torch.long))
    with pytest.raises(RuntimeError):
        torch.nonzero(X, out=torch.empty(0))  # not long: CPU's error
    with pytest.raises(RuntimeError):
        torch.nonzero(tpu(X), out=tpu(torch.empty(0)))


def i0_out(x, out):
    return torch.i0(x, out=out)


def histc_out(x, out):
    # (histc has a lowering now: its out= semantics, a size unlike x's, are checked the same)
    return torch.histc(x, 4, out=out)


@pytest.mark.parametrize("fn,shape", [(i0_out, (4, 5)), (histc_out, (4,))], ids=["i0", "histc"])
def test_fallback_out_layouts(fn, shape):
    x = make((4, 5), low=0.5, high=3)
    out_shape = shape
    compare_out(fn, x, torch.zeros(out_shape))                                  # right size
    if len(out_shape) == 2:
        compare_out(fn, x, torch.zeros(tuple(reversed(out_shape))).t())        # right size, transposed
    compare_out(fn, x, torch.zeros(3))                                           # wrong size: warns
    compare_out(fn, x, torch.zeros(0))                                           # empty: no warning


def test_fallback_out_strided_view():
    x = make((4, 5), low=0.5, high=3)
    base_cpu = torch.full((4, 10), 7.0)
    base_tpu = tpu(base_cpu)
    out_cpu, out_tpu = base_cpu[:, ::2], base_tpu[:, ::2]
    torch.i0(x, out=out_cpu)
    torch.i0(tpu(x), out=out_tpu)
    assert out_tpu.stride() == out_cpu.stride()
    assert_same(base_tpu, base_cpu)


def test_fallback_out_device_checked():
    x = tpu(make((4, 5), low=0.5, high=3))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but got out is on cpu"):
        torch.i0(x, out=torch.empty(4, 5))
    with pytest.raises(RuntimeError, match="same device"):
        torch.special.zeta(x, 2.0, out=torch.empty(4, 5))  # (no lowering: the CPU fallback)
    with pytest.raises(RuntimeError, match="same device"):
        torch.frexp(x, out=(tpu(torch.empty(0)), torch.empty(0, dtype=torch.int32)))
    # a correct call still works afterwards
    mantissa, exponent = tpu(torch.empty(0)), tpu(torch.empty(0, dtype=torch.int32))
    torch.frexp(x, out=(mantissa, exponent))
    m, e = torch.frexp(x.cpu())
    assert_same(mantissa, m)
    assert_same(exponent, e)


def test_fallback_reads_are_device_checked():
    # An op run by the CPU fallback (complex dtypes here) with one operand on
    # the host raised nothing and returned a CPU tensor; CUDA raises.
    a = torch.randn(3, dtype=torch.complex64)
    for fn in (torch.dot, torch.vdot, torch.mul, torch.outer):
        for x, y in ((a, tpu(a)), (tpu(a), a)):
            with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
                fn(x, y)
    # A 0-d CPU tensor stands for a scalar, as CUDA allows.
    s = torch.tensor(2 + 1j, dtype=torch.complex64)
    assert_same(torch.mul(tpu(a), s), torch.mul(a, s))


def test_resize_keeps_strides_when_size_unchanged():
    # ATen's resize_: same sizes, strides kept; other sizes, contiguous.
    for sizes in [(5, 4), (2, 2), (6, 4)]:
        c = make((4, 5)).t()
        t = tpu(make((4, 5))).t()
        c.resize_(sizes)
        t.resize_(sizes)
        assert t.shape == c.shape and t.stride() == c.stride(), (sizes, t.stride(), c.stride())
    c = make((4, 5)).t()
    t = tpu(make((4, 5))).t()
    assert_same(t.resize_(5, 4), c.resize_(5, 4))


def test_fallback_counted_once_per_call(metrics_delta):
    x = tpu(make((4, 5), low=0.5, high=3))
    out = tpu(torch.empty(4, 5))
    torch.i0(x, out=out)
    assert metrics_delta()["cpu_fallbacks"] == {"aten::i0.out": 1}
    assert torch_pjrt.metrics()["cpu_fallbacks"]["aten::i0.out"] >= 1


def test_mode_out_runs_as_cpu():
    # PyTorch's generic mode_out accepts CPU, CUDA and XPU only: it raised
    # "mode only supports CPU, CUDA and XPU device type, got: tpu".
    x = make((3, 5), seed=3).round()
    x[:, :2] = 1.0  # ties: the smallest mode, its last index, as CPU
    v, i = torch.empty(0), torch.empty(0, dtype=torch.long)
    vt, it = tpu(v), tpu(i)
    r = torch.mode(tpu(x), 1, out=(vt, it))
    assert r[0] is vt and r[1] is it
    torch.mode(x, 1, out=(v, i))
    assert_same(vt, v)
    assert_same(it, i)
    with pytest.raises(RuntimeError, match="expected scalar type 'Long' but got 'Int'"):
        torch.mode(tpu(x), 1, out=(tpu(v), tpu(i.int())))


def test_fallback_writes_into_conj_and_neg_views():
    # linalg_solve_triangular handles conj views itself, so its out= reaches
    # the CPU fallback (complex dtypes) as a conj view; the write-back was lost
    # or wrong. Fresh conj out, and out aliasing the conj right-hand side (as
    # PyTorch's test_linalg does). (A neg view out: CPU's kernel writes -X,
    # ignoring the bit; tpu writes X.)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 5, dtype=torch.complex64, generator=g).triu_()
    a.diagonal().add_(3)
    b0 = torch.randn(5, 3, dtype=torch.complex64, generator=g)
    for case in ("fresh conj", "aliases b.conj()"):
        res = []
        for dev in ("cpu", "tpu"):
            aa, bb = a.to(dev), b0.clone().to(dev)
            if case == "fresh conj":
                out = torch.zeros(5, 3, dtype=torch.complex64, device=dev).conj()
            else:
                bb = bb.conj()
                out = bb
            r = torch.linalg.solve_triangular(aa, bb, upper=True, out=out)
            assert r is out
            res.append(out.resolve_conj())
        assert_same(res[1], res[0], rtol=1e-5, atol=1e-5)


def test_resizing_a_non_empty_out_warns_on_every_call_as_cpu():
    # The plan's cached resize gives PyTorch's deprecation warning each time
    # (PyTorch's test_out_warning calls twice); an empty out= resizes silently.
    import warnings
    for _ in range(3):
        out = torch.ones(4, 5, device="tpu")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.tanh(torch.randn(4, 4, device="tpu"), out=out)
        assert out.shape == (4, 4)
        assert any("An output with one or more elements was resized" in str(x.message) for x in w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.tanh(torch.randn(4, 4, device="tpu"), out=torch.empty(0, device="tpu"))
