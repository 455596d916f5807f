"""CPU fallback: ops without a lowering run on the CPU, warn once, are counted,
and TORCH_PJRT_FALLBACK=error turns them into NotImplementedError."""
import warnings

import pytest
import torch

from conftest import assert_same, make, tpu, run_python


# Ops chosen because no lowering is planned for them (special functions).
FALLBACK_OP = "aten::special_chebyshev_polynomial_t.out"


def test_functional_op_runs_on_cpu_and_is_counted(metrics_delta):
    x, y = make((4, 5), low=1.5, high=3.0), make((4, 5), low=1.5, high=3.0)
    out = torch.special.chebyshev_polynomial_t(tpu(x), tpu(y))
    assert out.device.type == "tpu"
    assert_same(out, torch.special.chebyshev_polynomial_t(x, y))
    assert metrics_delta()["cpu_fallbacks"] == {FALLBACK_OP: 1}


def test_warns_once_per_op():
    x = tpu(make((3,), low=1.5, high=3.0))
    with warnings.catch_warnings(record=True) as first:
        warnings.simplefilter("always")
        torch.special.chebyshev_polynomial_t(x, x + 1)  # may be the first use in this process
        torch.special.chebyshev_polynomial_t(x, x + 2)
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        torch.special.chebyshev_polynomial_t(x, x + 3)
    assert len([w for w in first if "special_chebyshev_polynomial_t" in str(w.message)]) <= 1
    assert not [w for w in later if "special_chebyshev_polynomial_t" in str(w.message)]


def test_inplace_and_out_variants_write_to_tpu(metrics_delta):
    x = make((6,), low=0.5, high=4.0)
    t = tpu(x)
    view = t[1:5]
    view.i0_()  # in place on a view: the base storage must change
    expected = x.clone()
    expected[1:5].i0_()
    assert_same(t, expected)
    out = tpu(torch.empty(0))
    r = torch.i0(tpu(x), out=out)
    assert r is out and out.device.type == "tpu"
    assert_same(out, torch.i0(x))
    assert sum(metrics_delta()["cpu_fallbacks"].values()) == 2


def test_fallback_keeps_autograd():
    x = make((5,), low=0.5, high=4.0)
    xc = x.clone().requires_grad_()
    xt = tpu(x).requires_grad_()
    torch.i0(xt).sum().backward()  # backward (special_i1) falls back too
    torch.i0(xc).sum().backward()
    assert_same(xt.grad, xc.grad)


def test_supported_ops_lists_lowerings_not_fallbacks():
    import torch_pjrt
    ops = set(torch_pjrt.supported_ops())
    assert {"add", "mm", "sum"} <= ops
    assert "special_chebyshev_polynomial_t" not in ops and "i0" not in ops


def test_fallback_error_mode_raises_not_implemented():
    r = run_python(
        "import torch, torch_pjrt\n"
        "x = torch.ones(3, device='tpu')\n"
        "print((x + 1).cpu().tolist())\n"  # lowered ops still work
        "try:\n"
        "    torch.special.chebyshev_polynomial_t(x, x)\n"
        "except NotImplementedError as e:\n"
        "    print('NIE', e)\n",
        TORCH_PJRT_FALLBACK="error")
    assert r.returncode == 0, r.stderr
    assert "[2.0, 2.0, 2.0]" in r.stdout
    assert "NIE" in r.stdout and "aten::special_chebyshev_polynomial_t" in r.stdout and "TORCH_PJRT_FALLBACK=error" in r.stdout


def test_fallback_warning_names_a_complex_scalar_that_decides_the_dtype():
    # x ** 1j on a float64 tensor runs on CPU for the complex scalar: the
    # warning said only "(Double)". (x * 1j runs on the device.)
    r = run_python("import torch, torch_pjrt\nx = torch.ones(3, dtype=torch.float64, device='tpu')\n"
                   "print((x ** 1j).cpu().tolist())\n")
    assert r.returncode == 0, r.stderr
    assert "(1+0j)" in r.stdout
    assert "for these dtypes (Double, a complex scalar)" in r.stderr, r.stderr


def test_bad_fallback_mode_is_rejected():
    r = run_python("import torch, torch_pjrt\nx = torch.ones(3, device='tpu')\n"
                   "torch.special.chebyshev_polynomial_t(x, x)\n", TORCH_PJRT_FALLBACK="sometimes")
    assert r.returncode != 0 and "TORCH_PJRT_FALLBACK must be 'cpu' or 'error'" in r.stderr


def test_fallback_sees_the_tpu_layout_linalg_det_of_a_view():
    """Kernels that choose a convention from the input's layout (LU of
    linalg.det, read back by its backward) see the tpu tensor's exact strides:
    the gradient through det of a slice matches CPU. (det was a CPU fallback
    when this was written; its lowering now takes the layout from the plan.)"""
    torch.manual_seed(0)
    x, w0 = torch.randn(2, 3, 4), torch.randn(4, 4)
    grads = []
    for dev in ("cpu", "tpu"):
        w = w0.clone().to(dev).requires_grad_()
        torch.linalg.det(((x.to(dev) @ w).tanh())[:, :3, :3]).sum().backward()
        grads.append(w.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)


def test_fallback_off_the_importing_thread_starts_no_openmp_team():
    """A CPU fallback (or a CPU error check) on another thread (autograd's tpu
    thread, a user's thread) runs with one OpenMP thread: a second team makes
    libgomp stop spinning in every team, and PyTorch's CPU ops on the main
    thread ran 2.6x slower for the rest of the process (csrc/eager/cpu_threads.h).
    The op's CPU kernel reports the thread count it runs with."""
    import threading

    seen = []

    @torch.library.custom_op("torch_pjrt_test::threads_seen", mutates_args=(), device_types="cpu")
    def threads_seen(x: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return x + 1

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = tpu(torch.ones(4))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert_same(threads_seen(x), torch.full((4,), 2.0))
            after_in_thread = []

            def other():
                threads_seen(x)
                after_in_thread.append(torch.get_num_threads())

            t = threading.Thread(target=other)
            t.start()
            t.join()
            threads_seen(x)
        # main thread: PyTorch's count; the other thread: one while the op ran,
        # its own setting again after it
        assert seen == [2, 1, 2] and after_in_thread == [2], (seen, after_in_thread)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
