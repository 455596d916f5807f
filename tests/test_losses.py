"""Loss functions and softmax backward on tpu vs PyTorch on CPU, forward and backward."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch_pjrt
import torch.nn.functional as F

from conftest import assert_same, make, tpu, check_raises

# Every test here must run on lowered ops only.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

REDUCTIONS = ["none", "mean", "sum"]
DTYPES = [torch.float32, torch.bfloat16]


def run(fn, inputs, grad_idx, device, upcast=False):
    """fn's output and the grads of inputs[grad_idx]; upcast=True computes in
    float32 from bfloat16 inputs and rounds the results back."""
    def prep(i, x):
        if not isinstance(x, torch.Tensor):
            return x
        x = x.detach().to(device)
        if upcast and x.dtype == torch.bfloat16:
            x = x.float()
        return x.requires_grad_(i in grad_idx)
    args = [prep(i, x) for i, x in enumerate(inputs)]
    y = fn(*args)
    g = make(y.shape, inputs[0].dtype, low=-1, high=1, seed=7).to(device, y.dtype)
    y.backward(g)
    down = (lambda t: t.to(inputs[0].dtype)) if upcast else (lambda t: t)
    return down(y.detach()), [down(args[i].grad) for i in grad_idx]


def check(fn, *inputs, grad_idx=(0,), rtol=None, atol=None, upcast_reference=False):
    """Output and the grads of inputs[grad_idx] on tpu match CPU. upcast_reference:
    the CPU reference is computed in float32 and rounded (for bfloat16 losses whose
    CPU kernels round intermediates where the lowering keeps float32)."""
    expected = run(fn, inputs, grad_idx, "cpu", upcast=upcast_reference)
    actual = run(fn, inputs, grad_idx, "tpu")
    assert_same(actual[0], expected[0], rtol, atol)
    assert_same(actual[1], expected[1], rtol, atol)


def targets(shape, classes, ignore=None, seed=1):
    t = torch.randint(0, classes, shape, generator=torch.Generator().manual_seed(seed))
    if ignore is not None:
        t.view(-1)[::3] = ignore
    return t


# ---- nll_loss / cross_entropy ------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted,ignore_index", [(False, -100), (True, 2)])
def test_nll_loss(dtype, reduction, weighted, ignore_index):
    x = make((6, 5), dtype)
    t = targets((6,), 5, ignore=ignore_index)
    w = make((5,), dtype, low=0.1, high=2) if weighted else None
    check(lambda x: F.nll_loss(x, t.to(x.device), weight=None if w is None else w.to(x.device), reduction=reduction,
                               ignore_index=ignore_index), x)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss_unbatched_and_total_weight(reduction):
    x = make((5,))
    check(lambda x: F.nll_loss(x, torch.tensor(3, device=x.device), reduction=reduction), x)
    w = make((5,), low=0.5, high=1.5)
    t = targets((4,), 5, ignore=-100)
    for r in (0, 1, 2):
        cpu = torch.ops.aten.nll_loss_forward(make((4, 5)), t, w, r, -100)
        assert_same(torch.ops.aten.nll_loss_forward(*tpu((make((4, 5)), t, w)), r, -100), cpu)
    # Only ignored targets: mean is 0/0 = nan and total_weight 0, as on CPU.
    check(lambda x: F.nll_loss(x, torch.full((3,), -100, device=x.device)), make((3, 5)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss2d_and_nd(dtype, reduction):
    x = make((2, 4, 3, 5), dtype)
    t = targets((2, 3, 5), 4, ignore=1)
    w = make((4,), dtype, low=0.1, high=2)
    check(lambda x: F.nll_loss(x, t.to(x.device), weight=w.to(x.device), reduction=reduction,
                               ignore_index=1), x)
    # 3-d input (N, C, d) goes through nll_loss_nd's reshape to 2-d.
    x3 = make((2, 4, 3), dtype)
    check(lambda x: F.nll_loss(x, targets((2, 3), 4).to(x.device), reduction=reduction), x3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_cross_entropy_class_targets(dtype, reduction, label_smoothing):
    x = make((6, 5), dtype, low=-5, high=5)
    t = targets((6,), 5, ignore=-100)
    w = make((5,), dtype, low=0.1, high=2)
    check(lambda x: F.cross_entropy(x, t.to(x.device), reduction=reduction,
                                    label_smoothing=label_smoothing), x)
    check(lambda x: F.cross_entropy(x, t.to(x.device), weight=w.to(x.device), reduction=reduction,
                                    label_smoothing=label_smoothing), x)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_probability_targets(reduction, label_smoothing):
    x = make((4, 5, 3), low=-4, high=4)
    p = torch.softmax(make((4, 5, 3), seed=3), dim=1)
    w = make((5,), low=0.1, high=2)
    check(lambda x, p: F.cross_entropy(x, p, reduction=reduction, label_smoothing=label_smoothing),
          x, p, grad_idx=(0, 1))
    check(lambda x, p: F.cross_entropy(x, p, weight=w.to(x.device), reduction=reduction), x, p)


def test_nll_loss_bad_target_shape_raises_like_cpu():
    x = make((4, 5))
    check_raises(lambda x, t: F.nll_loss(x, t), x, targets((3,), 5))
    check_raises(lambda x, t: F.nll_loss(x, t), make((2, 5, 3, 3)), targets((2, 3), 5))
    check_raises(lambda x, t: F.nll_loss(x, t), x, targets((4,), 5).float())
    check_raises(lambda x, w: F.nll_loss(x, targets((4,), 5).to(x.device), weight=w), x, make((4,)))


def test_debug_mode_checks_nll_loss_target_range():
    # Target values are only checked in debug mode (TORCH_PJRT_EAGER=debug), in a subprocess.
    script = textwrap.dedent("""
        import torch, torch_pjrt
        import torch.nn.functional as F
        x = torch.zeros(3, 5, device="tpu")
        t = lambda *v: torch.tensor(v, device="tpu")
        for name, fn in {"high": lambda: F.nll_loss(x, t(0, 5, 1)), "negative": lambda: F.cross_entropy(x, t(-1, 0, 0)),
                         "2d": lambda: F.nll_loss(torch.zeros(1, 5, 2, 2, device="tpu"), t([[0, 9], [1, 1]]))}.items():
            try:
                fn().cpu()
                print(name, "no error")
            except IndexError:
                print(name, "IndexError")
        print("valid", F.nll_loss(x, t(0, -100, 4)).cpu().item(), F.nll_loss(x, t(0, 7, 4), ignore_index=7).cpu().item())
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TORCH_PJRT_EAGER="debug", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for name in ["high", "negative", "2d"]:
        assert f"{name} IndexError" in out.stdout, out.stdout
    assert "valid" in out.stdout, out.stdout


# ---- softmax backward ----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + [torch.float64])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_backward(dtype, dim, log):
    fn = F.log_softmax if log else F.softmax
    check(lambda x: fn(x, dim), make((3, 4, 5), dtype, low=-4, high=4))


def test_softmax_backward_half_to_float_and_0d():
    x = make((3, 4), torch.bfloat16)
    check(lambda x: F.softmax(x, 1, dtype=torch.float32), x)
    check(lambda x: F.log_softmax(x, 0, dtype=torch.float32), x)
    check(lambda x: F.softmax(x, 0), torch.tensor(1.5))
    g, y = make((3, 4)), torch.softmax(make((3, 4), seed=2), 1)
    for op in (torch.ops.aten._softmax_backward_data, torch.ops.aten._log_softmax_backward_data):
        assert_same(op(*tpu((g, y)), 1, torch.bfloat16), op(g, y, 1, torch.bfloat16))


# ---- regression losses ---------------------------------------------------------

# bfloat16 with mean only: the reductions are dtype-independent code.
@pytest.mark.parametrize("dtype,reduction", [(torch.float32, r) for r in REDUCTIONS] + [(torch.bfloat16, "mean")])
@pytest.mark.parametrize("loss", ["mse", "l1", "smooth_l1", "smooth_l1_b0", "smooth_l1_b2", "huber",
                                  "huber_d05"])
def test_regression_losses(dtype, reduction, loss):
    fn = {"mse": lambda x, y: F.mse_loss(x, y, reduction=reduction),
          "l1": lambda x, y: F.l1_loss(x, y, reduction=reduction),
          "smooth_l1": lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction),
          "smooth_l1_b0": lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.0),
          "smooth_l1_b2": lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=2.0),
          "huber": lambda x, y: F.huber_loss(x, y, reduction=reduction),
          "huber_d05": lambda x, y: F.huber_loss(x, y, reduction=reduction, delta=0.5)}[loss]
    x, y = make((4, 6), dtype), make((4, 6), dtype, seed=1)
    x[0, :3] = y[0, :3]  # d == 0, on the kinks of l1/smooth_l1
    check(fn, x, y, grad_idx=(0, 1))


def test_regression_losses_broadcast_and_noncontiguous():
    x, y = make((3, 4), noncontiguous=True), make((3, 4), seed=1, noncontiguous=True)
    for fn in (F.mse_loss, F.smooth_l1_loss, F.huber_loss):
        check(fn, x, y, grad_idx=(0, 1))
    with pytest.warns(UserWarning):  # target broadcast to input: PyTorch warns, then computes
        check(lambda x, y: F.mse_loss(x, y, reduction="sum"), make((3, 4)), make((4,)), grad_idx=(0, 1))


# ---- binary cross entropy ------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_binary_cross_entropy(dtype, reduction, weighted):
    p = make((4, 5), dtype, low=0.02, high=0.98)
    t = make((4, 5), dtype, low=0, high=1, seed=1)
    p[0, 0], t[0, 0] = 0.0, 0.0  # log(0) clamps to -100
    p[0, 1], t[0, 1] = 1.0, 1.0
    w = make((5,), dtype, low=0.1, high=2) if weighted else None
    check(lambda p, t: F.binary_cross_entropy(p, t, weight=None if w is None else w.to(p.device),
                                              reduction=reduction), p, t, grad_idx=(0,))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted,pos_weighted", [(False, False), (False, True), (True, True)])
def test_binary_cross_entropy_with_logits(dtype, reduction, weighted, pos_weighted):
    x = make((4, 5), dtype, low=-30, high=30)
    t = make((4, 5), dtype, low=0, high=1, seed=1)
    w = make((5,), dtype, low=0.1, high=2, seed=2) if weighted else None
    pw = make((5,), dtype, low=0.1, high=3, seed=3) if pos_weighted else None
    check(lambda x, t: F.binary_cross_entropy_with_logits(
        x, t, weight=None if w is None else w.to(x),
        pos_weight=None if pw is None else pw.to(x), reduction=reduction), x, t, grad_idx=(0, 1),
        # CPU's composite rounds each step to bfloat16: up to 15% off where terms cancel.
        upcast_reference=dtype == torch.bfloat16)


def test_bce_bad_shapes_raise_like_cpu():
    check_raises(lambda p, t: F.binary_cross_entropy(p, t), make((4, 5), low=0, high=1),
                 make((4, 4), low=0, high=1))
    check_raises(lambda x, t: F.binary_cross_entropy_with_logits(x, t), make((4, 5)), make((5, 4)))


# ---- kl_div (CompositeImplicitAutograd: elementwise ops) ------------------------

@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "none"])
def test_kl_div(log_target, reduction):
    x = torch.log_softmax(make((4, 5)), 1)
    t = torch.softmax(make((4, 5), seed=1), 1)
    if log_target:
        t = t.log()
    check(lambda x, t: F.kl_div(x, t, reduction=reduction, log_target=log_target), x, t, grad_idx=(0, 1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_l1_and_kl_div_run_lowered(dtype, metrics_delta):
    # l1_loss's backward uses sgn, kl_div uses xlogy: both lowered, no CPU fallback.
    a, b = make((4, 6), dtype), make((4, 6), dtype, seed=1)
    check(lambda x, y: torch.nn.functional.l1_loss(x, y), a, b)
    logp = torch.log_softmax(make((4, 6), torch.float32), -1).to(dtype)
    p = torch.softmax(make((4, 6), torch.float32, seed=2), -1).to(dtype)
    p[0, 0] = 0  # xlogy(0, 0) = 0
    check(lambda x, t: torch.nn.functional.kl_div(x, t, reduction="batchmean"), logp, p)
    assert metrics_delta()["cpu_fallbacks"] == {}


@pytest.mark.parametrize("bad", [1.5, -0.25, float("nan")])
def test_binary_cross_entropy_rejects_inputs_outside_0_1(bad):
    # CPU raises RuntimeError; tpu raises it at the next read (the value is
    # checked on the device), never returns a loss.
    x = torch.tensor([0.5, bad, 0.25])
    t = torch.tensor([1.0, 1.0, 0.0])
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(x, t)
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(tpu(x), tpu(t)).item()
    ok = torch.tensor([0.0, 1.0, 0.25])
    assert_same(F.binary_cross_entropy(tpu(ok), tpu(t)), F.binary_cross_entropy(ok, t))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss_with_a_uint8_target_and_its_gradient(reduction, no_cpu_fallback):
    # CPU takes a Byte target as a Long one; PyTorch's Meta function for the
    # backward did not (a scatter of uint8 indices).
    x = make((10, 4), torch.float32)
    t = torch.randint(0, 4, (10,), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    res = []
    for dev in ("cpu", "tpu"):
        xd = x.to(dev).detach().clone().requires_grad_(True)
        loss = F.nll_loss(F.log_softmax(xd, -1), t.to(dev), reduction=reduction)
        loss.sum().backward()
        res.append((loss.detach(), xd.grad))
    assert_same(res[1][0], res[0][0])
    assert_same(res[1][1], res[0][1])
