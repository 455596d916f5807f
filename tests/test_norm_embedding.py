"""Batch/layer/group normalization, embedding and dropout on tpu vs PyTorch on CPU:
outputs, input/weight/bias gradients and (batch norm) running statistics."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import assert_same, make, tpu

HALF = [torch.float32, torch.bfloat16]

# Gradients: sums over a few dozen elements in float32, CPU accumulating in double.
GRAD_TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2)}

def run_module(module, x, grad_seed=1):
    """Forward + backward of `module` on CPU and of a copy on tpu from the same input and
    upstream gradient; compares output, input grad and every parameter's grad."""
    m_tpu = copy.deepcopy(module).to("tpu")
    xc = x.clone().requires_grad_(True)
    xt = tpu(x).requires_grad_(True)
    out_c, out_t = module(xc), m_tpu(xt)
    assert_same(out_t, out_c)
    g = make(out_c.shape, out_c.dtype, seed=grad_seed)
    out_c.backward(g)
    out_t.backward(tpu(g))
    rtol, atol = GRAD_TOL[x.dtype]
    assert_same(xt.grad, xc.grad, rtol=rtol, atol=atol)
    for pc, pt in zip(module.parameters(), m_tpu.parameters()):
        assert_same(pt.grad, pc.grad, rtol=rtol, atol=atol)
    return module, m_tpu


def randomize(module, dtype, seed=3):
    """Non-trivial affine parameters (and running stats), so their roles are tested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)
        if getattr(module, "running_mean", None) is not None:
            module.running_mean.copy_(torch.rand(module.running_mean.shape, generator=g) - 0.5)
            module.running_var.copy_(torch.rand(module.running_var.shape, generator=g) + 0.5)
    return module.to(dtype)


# ---- batch norm ------------------------------------------------------------------------------

BN_CASES = [(nn.BatchNorm1d, (6, 3)), (nn.BatchNorm1d, (4, 3, 5)), (nn.BatchNorm2d, (3, 4, 5, 2)),
            (nn.BatchNorm3d, (2, 3, 2, 3, 2))]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("cls,shape", BN_CASES)
def test_batch_norm_train(cls, shape, dtype):
    bn = randomize(cls(shape[1], momentum=0.3), dtype)
    x = make(shape, dtype)
    mc, mt = run_module(bn, x)
    # Running stats: momentum blend with the unbiased batch variance, updated in place.
    assert_same(mt.running_mean, mc.running_mean)
    assert_same(mt.running_var, mc.running_var)
    assert mt.num_batches_tracked.item() == mc.num_batches_tracked.item() == 1
    # A second step starts from the updated statistics.
    x2 = make(shape, dtype, seed=7)
    assert_same(mt(tpu(x2)), mc(x2))
    assert_same(mt.running_var, mc.running_var)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("cls,shape", BN_CASES)
def test_batch_norm_eval(cls, shape, dtype):
    bn = randomize(cls(shape[1]), dtype).eval()
    x = make(shape, dtype)
    mc, mt = run_module(bn, x)
    assert_same(mt.running_mean, mc.running_mean)  # unchanged
    assert_same(mt.running_var, mc.running_var)


@pytest.mark.parametrize("dtype", HALF)
def test_batch_norm_no_running_stats(dtype):
    bn = randomize(nn.BatchNorm2d(3, track_running_stats=False), dtype)
    run_module(bn, make((4, 3, 2, 3), dtype))
    bn = randomize(nn.BatchNorm2d(3, track_running_stats=False), dtype).eval()
    run_module(bn, make((4, 3, 2, 3), dtype, seed=2))  # batch statistics in eval too


@pytest.mark.parametrize("track", [False, True])
def test_batch_norm_no_affine(track):
    bn = randomize(nn.BatchNorm1d(3, affine=False, track_running_stats=track), torch.float32)
    mc, mt = run_module(bn, make((5, 3, 4)))
    if track:
        assert_same(mt.running_var, mc.running_var)


def test_batch_norm_functional_momentum_and_mixed_dtype():
    # bfloat16 input with float32 parameters and stats, as autocast leaves them.
    x = make((4, 3, 5), torch.bfloat16)
    w, b = make((3,), low=0.5, high=1.5), make((3,), seed=2)
    rm, rv = make((3,), seed=4), make((3,), low=0.5, high=2, seed=5)
    rm_t, rv_t = tpu(rm), tpu(rv)
    out_t = F.batch_norm(tpu(x), rm_t, rv_t, tpu(w), tpu(b), training=True, momentum=0.7, eps=1e-3)
    out_c = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.7, eps=1e-3)
    assert_same(out_t, out_c)
    assert_same(rm_t, rm)
    assert_same(rv_t, rv)


def test_native_batch_norm_legit_is_lowered(no_cpu_fallback):
    # What make_fx/functorch traces and decomposed exports call; it ran on the
    # CPU fallback. Eval mode gives the saved statistics as CUDA does ([C]:
    # the running mean and its invstd), as native_batch_norm here does.
    aten = torch.ops.aten
    x, w, b = make((3, 2, 4)), make((2,), seed=1), make((2,), seed=2)
    rm, rv = make((2,), seed=3), make((2,), low=0.5, high=1.5, seed=4)
    for training in [True, False]:
        rm_c, rv_c, rm_t, rv_t = rm.clone(), rv.clone(), tpu(rm), tpu(rv)
        got = aten._native_batch_norm_legit.default(tpu(x), tpu(w), tpu(b), rm_t, rv_t, training, 0.1, 1e-5)
        want = aten._native_batch_norm_legit.default(x, w, b, rm_c, rv_c, training, 0.1, 1e-5)
        assert_same(got[0], want[0])
        assert_same(rm_t, rm_c)
        assert_same(rv_t, rv_c)
        if training:
            assert_same(got[1], want[1])
            assert_same(got[2], want[2])
        else:
            assert_same(got[1], rm)
            assert_same(got[2], torch.rsqrt(rv + 1e-5))
    got = aten._native_batch_norm_legit.no_stats(tpu(x), tpu(w), tpu(b), True, 0.1, 1e-5)
    want = aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)
    for g, c in zip(got, want):
        assert_same(g, c)


def test_native_batch_norm_legit_without_stats_in_eval_mode_raises():
    # CPU's kernel segfaults here; the error check asked it and crashed too.
    x, w, b = tpu(make((3, 2, 4))), tpu(make((2,))), tpu(make((2,)))
    with pytest.raises(Exception, match="running_mean and running_var must not be None in eval mode"):
        torch.ops.aten._native_batch_norm_legit.no_stats(x, w, b, False, 0.1, 1e-5)


def test_batch_norm_with_update_no_update_and_backward_are_lowered(no_cpu_fallback):
    # What export's training IR calls; they ran on the CPU fallback.
    aten = torch.ops.aten
    x, w, b = make((3, 2, 4)), make((2,), seed=1), make((2,), seed=2)
    rm, rv = make((2,), seed=3), make((2,), low=0.5, high=1.5, seed=4)
    for update in [True, False]:
        op = aten._batch_norm_with_update if update else aten._batch_norm_no_update
        results = {}
        for dev in ("cpu", "tpu"):
            xs, ws, bs = (t.clone().to(dev).requires_grad_() for t in (x, w, b))
            stats = [rm.clone().to(dev), rv.clone().to(dev)]
            out = op(xs, ws, bs, *stats, 0.1, 1e-5)
            (out[0] * out[0]).sum().backward()
            results[dev] = (out[0], *stats, xs.grad, ws.grad, bs.grad, out[3])
        for got, want in zip(results["tpu"], results["cpu"]):
            assert_same(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(AssertionError, match="must not be None"):  # (CPU's kernel segfaults)
        aten._batch_norm_no_update(tpu(x), None, None, None, None, 0.1, 1e-5)
    got = aten._batch_norm_no_update(tpu(x), None, None, tpu(rm), tpu(rv), 0.1, 1e-5)
    for g, c in zip(got, aten._batch_norm_no_update(x, None, None, rm, rv, 0.1, 1e-5)):
        assert_same(g, c)


def test_batch_norm_raises_like_cpu():
    bn = nn.BatchNorm1d(3)
    x = make((4, 5))  # wrong number of channels
    with pytest.raises(RuntimeError):
        bn(x)
    with pytest.raises(RuntimeError):
        copy.deepcopy(bn).to("tpu")(tpu(x))


# ---- layer norm (backward) -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape,normalized", [((4, 6), (6,)), ((2, 3, 8), (8,)), ((2, 3, 4), (3, 4)),
                                              ((5,), (5,))])
def test_layer_norm(shape, normalized, dtype):
    run_module(randomize(nn.LayerNorm(normalized), dtype), make(shape, dtype))


@pytest.mark.parametrize("kwargs", [dict(elementwise_affine=False), dict(bias=False)])
def test_layer_norm_without_affine_or_bias(kwargs):
    run_module(randomize(nn.LayerNorm(6, **kwargs), torch.float32), make((3, 6)))


def test_layer_norm_noncontiguous_and_eps():
    x = make((3, 8), noncontiguous=True)
    w, b = make((8,), seed=1), make((8,), seed=2)
    xc, xt = x.clone().requires_grad_(), tpu(x).requires_grad_()
    wc, wt = w.clone().requires_grad_(), tpu(w).requires_grad_()
    bc, bt = b.clone().requires_grad_(), tpu(b).requires_grad_()
    out_c = F.layer_norm(xc, (8,), wc, bc, eps=0.1)
    out_t = F.layer_norm(xt, (8,), wt, bt, eps=0.1)
    assert_same(out_t, out_c)
    out_c.pow(2).sum().backward()
    out_t.pow(2).sum().backward()
    assert_same(xt.grad, xc.grad, rtol=1e-4, atol=1e-4)
    assert_same(wt.grad, wc.grad, rtol=1e-4, atol=1e-4)
    assert_same(bt.grad, bc.grad, rtol=1e-4, atol=1e-4)


# ---- group norm ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("groups,channels,shape", [(1, 4, (3, 4)), (2, 4, (2, 4, 5)), (4, 4, (2, 4, 3, 2)),
                                                   (3, 6, (2, 6, 2, 2, 2))])
def test_group_norm(groups, channels, shape, dtype):
    run_module(randomize(nn.GroupNorm(groups, channels), dtype), make(shape, dtype))


def test_group_norm_no_affine():
    run_module(nn.GroupNorm(2, 4, affine=False), make((3, 4, 5)))


def test_group_norm_raises_like_cpu():
    x = make((2, 6, 3))
    with pytest.raises(RuntimeError):
        F.group_norm(x, 4)
    with pytest.raises(RuntimeError):
        F.group_norm(tpu(x), 4)


# ---- embedding -------------------------------------------------------------------------------

def run_embedding(weight, idx, grad_seed=1, **kwargs):
    wc, wt = weight.clone().requires_grad_(), tpu(weight).requires_grad_()
    out_c, out_t = F.embedding(idx, wc, **kwargs), F.embedding(tpu(idx), wt, **kwargs)
    assert_same(out_t, out_c, rtol=0, atol=0)
    g = make(out_c.shape, out_c.dtype, seed=grad_seed)
    out_c.backward(g)
    out_t.backward(tpu(g))
    assert_same(wt.grad, wc.grad)


IDX = torch.tensor([[1, 3, 3, 0], [7, 3, 1, 9]])


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kwargs", [{}, dict(padding_idx=3), dict(padding_idx=-1), dict(scale_grad_by_freq=True),
                                    dict(padding_idx=1, scale_grad_by_freq=True)])
def test_embedding(kwargs, dtype):
    run_embedding(make((10, 4), dtype), IDX, **kwargs)


@pytest.mark.parametrize("idx", [torch.tensor([2, 2, 2, 5], dtype=torch.int32), torch.tensor(4),
                                 torch.zeros(0, dtype=torch.long), torch.arange(12).reshape(2, 3, 2) % 5])
def test_embedding_index_shapes(idx):
    run_embedding(make((6, 3)), idx)


def test_embedding_module():
    emb = nn.Embedding(8, 5, padding_idx=0)
    emb_t = copy.deepcopy(emb).to("tpu")
    idx = torch.tensor([0, 4, 4, 7])
    emb(idx).sum().backward()
    emb_t(tpu(idx)).sum().backward()
    assert_same(emb_t.weight.grad, emb.weight.grad)
    assert emb_t.weight.grad[0].abs().sum().item() == 0


def test_embedding_raises_like_cpu():
    w = make((5, 3))
    for bad in (torch.tensor([1.0, 2.0]),):  # float indices
        with pytest.raises(RuntimeError):
            F.embedding(bad, w)
        with pytest.raises(RuntimeError):
            F.embedding(tpu(bad), tpu(w))


# ---- dropout ---------------------------------------------------------------------------------

N = 20_000


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("p", [0.2, 0.5, 0.9])
def test_dropout_statistics_and_scaling(p, dtype):
    x = (make((N,), torch.float32, low=1, high=2)).to(dtype)
    y = F.dropout(tpu(x), p).cpu()
    assert y.dtype == dtype
    zeroed = (y == 0)
    frac = zeroed.double().mean().item()
    assert abs(frac - p) < 4 * (p * (1 - p) / N) ** 0.5 + 1e-3
    # Kept elements are x / (1 - p), rounded as CPU rounds x * (1 / (1 - p)).
    expect = (x.float() * (1.0 / (1.0 - p))).to(dtype)
    assert torch.equal(y[~zeroed], expect[~zeroed])


def test_dropout_seed_determinism():
    x = tpu(torch.ones(1000))
    torch.manual_seed(123)
    a = F.dropout(x, 0.5).cpu()
    b = F.dropout(x, 0.5).cpu()
    torch.manual_seed(123)
    c = F.dropout(x, 0.5).cpu()
    assert torch.equal(a, c)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("dtype", HALF)
def test_dropout_grad_follows_mask(dtype):
    p = 0.3
    x = tpu(make((50, 40), dtype)).requires_grad_()
    y = F.dropout(x, p)
    g = make((50, 40), dtype, seed=2)
    y.backward(tpu(g))
    kept = (y.detach().cpu() != 0)
    expect = torch.where(kept, (g.float() * (1 / (1 - p))).to(dtype), torch.zeros((), dtype=dtype))
    assert_same(x.grad, expect, rtol=0, atol=0)


def test_native_dropout_direct():
    x = make((30, 30))
    out, mask = torch.ops.aten.native_dropout(tpu(x), 0.4, True)
    assert mask.dtype == torch.bool and out.dtype == torch.float32
    out, mask = out.cpu(), mask.cpu()
    assert torch.equal(out, x * mask * (1 / 0.6))
    grad = torch.ops.aten.native_dropout_backward(tpu(x), tpu(mask), 1 / 0.6)
    assert_same(grad, torch.ops.aten.native_dropout_backward(x, mask, 1 / 0.6))
    # train=False: the input and an all-true mask, as on CPU.
    out, mask = torch.ops.aten.native_dropout(tpu(x), 0.4, False)
    assert_same(out, x, rtol=0, atol=0)
    assert mask.cpu().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_keeps_nan_and_inf_nan_where_dropped(dtype):
    # CPU computes input * mask * scale: a dropped NaN or inf is NaN, not 0
    # (PyTorch's SDPA tests: softmax over a fully masked row, then dropout).
    x = torch.full((64,), float("nan"), dtype=dtype)
    x[32:] = float("inf")
    out, mask = torch.ops.aten.native_dropout(tpu(x), 0.5, True)
    out, mask = out.cpu(), mask.cpu()
    assert not mask.all() and mask.any()
    assert torch.isnan(out[:32]).all()
    assert torch.isnan(out[32:][~mask[32:]]).all() and torch.isinf(out[32:][mask[32:]]).all()
    assert torch.isnan(F.dropout(torch.softmax(tpu(torch.full((1, 16), float("-inf"))), -1), 0.5)).all()


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_dropout_edge_probabilities(p):
    x = make((8, 5))
    xc, xt = x.clone().requires_grad_(), tpu(x).requires_grad_()
    out_c, out_t = F.dropout(xc, p), F.dropout(xt, p)
    assert_same(out_t, out_c, rtol=0, atol=0)
    out_c.sum().backward()
    out_t.sum().backward()
    assert_same(xt.grad, xc.grad, rtol=0, atol=0)


def test_dropout_module_train_eval():
    drop = nn.Dropout(0.5)
    x = tpu(make((100,), low=1, high=2))
    assert (drop(x).cpu() == 0).any()
    drop.eval()
    assert_same(drop(x), x.cpu(), rtol=0, atol=0)


def test_dropout_raises_like_cpu():
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            F.dropout(torch.ones(3), bad)
        with pytest.raises(ValueError):
            F.dropout(tpu(torch.ones(3)), bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm(dim, dtype, no_cpu_fallback):
    """Weight normalization (aten::_weight_norm_interface and its backward, which
    ran on the CPU fallback; Wav2Vec2's positional conv uses it): the module's
    output and the gradients of input, g and v, for the first and last dim."""
    module = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3), dim=dim)
    randomize(module, dtype)
    run_module(module.to(dtype), make((2, 4, 7), dtype))


@pytest.mark.parametrize("arg", ["weight", "bias", "running_mean", "running_var"])
def test_batch_norm_aten_op_with_a_wrong_sized_channel_tensor_names_it(arg):
    # The aten op's Meta kernel checks no per-channel sizes (CPU's kernel reads
    # what it finds): the lowering names the tensor instead of a builder error.
    args = {"weight": torch.ones(3), "bias": torch.zeros(3), "running_mean": torch.zeros(3),
            "running_var": torch.ones(3)}
    args[arg] = torch.ones(4)
    x = tpu(make((2, 3, 4)))
    with pytest.raises(RuntimeError, match=f"{arg} should contain 3 elements"):
        torch.ops.aten._native_batch_norm_legit(x, *(tpu(args[k]) for k in args), True, 0.1, 1e-5)[0].cpu()


def test_weight_norm_op_with_a_wrong_sized_g_names_it():
    # (CPU's kernel reads past g; the op's Meta checks nothing; XLA's compile failed.)
    with pytest.raises(RuntimeError, match="g should have 3 elements"):
        torch._weight_norm(tpu(make((3, 4))), tpu(make((2, 1))), 0).cpu()
