"""Autograd on tpu tensors: leaves, accumulation, retain_graph, no_grad,
inference_mode, tied weights, optimizers and clip_grad_norm_ vs CPU."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import assert_same, make, tpu

GRAD_TOL = dict(rtol=1e-5, atol=1e-5)


def test_requires_grad_and_leaf_grad():
    x = make((3, 4))
    xt = tpu(x).requires_grad_()
    assert xt.is_leaf and xt.requires_grad and xt.grad is None
    ((xt * xt).sum() + xt.exp().mean()).backward()
    xc = x.clone().requires_grad_()
    ((xc * xc).sum() + xc.exp().mean()).backward()
    assert xt.grad.device.type == "tpu"
    assert_same(xt.grad, xc.grad)


def test_gradient_accumulates_and_zero_grad():
    lin_c = nn.Linear(4, 3)
    lin_t = copy.deepcopy(lin_c).to("tpu")
    xs = [make((2, 4), seed=s) for s in range(3)]
    for m, dev in ((lin_c, "cpu"), (lin_t, "tpu")):
        for x in xs:  # three micro-batches, one optimizer step's worth
            m(x.to(dev)).pow(2).sum().backward()
    assert_same(lin_t.weight.grad, lin_c.weight.grad, **GRAD_TOL)
    assert_same(lin_t.bias.grad, lin_c.bias.grad, **GRAD_TOL)
    lin_t.zero_grad(set_to_none=False)
    assert lin_t.weight.grad.device.type == "tpu"
    assert float(lin_t.weight.grad.abs().sum()) == 0.0
    lin_t.zero_grad()
    assert lin_t.weight.grad is None


def test_retain_graph_backward_twice():
    x = make((5,))
    xt, xc = tpu(x).requires_grad_(), x.clone().requires_grad_()
    for v in (xt, xc):
        y = (v.sin() * v).sum()
        y.backward(retain_graph=True)
        y.backward()
    assert_same(xt.grad, xc.grad)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y = (xt * 2).sin().sum()
        y.backward()
        y.backward()


def test_no_grad_and_inference_mode():
    w = tpu(make((3,))).requires_grad_()
    with torch.no_grad():
        y = w * 2
    assert not y.requires_grad
    with torch.inference_mode():
        z = w * 3
    assert not z.requires_grad and z.is_inference()
    assert_same(z, w.detach().cpu() * 3)


def test_tied_weights_get_both_gradients():
    emb_c = nn.Embedding(10, 4)
    head_c = nn.Linear(4, 10, bias=False)
    head_c.weight = emb_c.weight
    idx = torch.tensor([[1, 2, 3], [4, 5, 1]])

    def loss(emb, head, i):
        return F.cross_entropy(head(emb(i)).view(-1, 10), i.view(-1))

    emb_t = copy.deepcopy(emb_c).to("tpu")
    head_t = nn.Linear(4, 10, bias=False).to("tpu")
    head_t.weight = emb_t.weight
    loss(emb_c, head_c, idx).backward()
    loss(emb_t, head_t, tpu(idx)).backward()
    assert head_t.weight is emb_t.weight
    assert_same(emb_t.weight.grad, emb_c.weight.grad, **GRAD_TOL)


def _step_pair(make_opt, steps=3, **model_kw):
    torch.manual_seed(0)
    model_c = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    model_t = copy.deepcopy(model_c).to("tpu")
    opt_c, opt_t = make_opt(model_c.parameters()), make_opt(model_t.parameters())
    for s in range(steps):
        x, y = make((4, 6), seed=s), torch.tensor([0, 1, 2, 1])
        for m, o, dev in ((model_c, opt_c, "cpu"), (model_t, opt_t, "tpu")):
            o.zero_grad()
            F.cross_entropy(m(x.to(dev)), y.to(dev)).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            o.step()
    for pc, pt in zip(model_c.parameters(), model_t.parameters()):
        assert_same(pt, pc, rtol=1e-5, atol=1e-6)
    return opt_t


@pytest.mark.parametrize("name,make_opt", [
    ("sgd_momentum", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True)),
    ("sgd_wd", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5, weight_decay=1e-2)),
    ("adam", lambda ps: torch.optim.Adam(ps, lr=1e-2)),
    ("adam_amsgrad", lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True)),
    ("adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)),
    ("adam_foreach_off", lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False)),
])
def test_optimizers_match_cpu(name, make_opt, metrics_delta):
    _step_pair(make_opt)
    assert metrics_delta()["cpu_fallbacks"] == {}


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True),
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True),
    lambda ps: torch.optim.Adagrad(ps, lr=0.1, lr_decay=0.05, weight_decay=0.1, fused=True),
    # 1 - beta2 was taken in float32 (1.36e-3 off for 0.99999) against the
    # bias correction's float64 beta2: every update 7e-4 off.
    lambda ps: torch.optim.Adam(ps, lr=0.1, betas=(0.9, 0.99999), fused=True),
    lambda ps: torch.optim.AdamW(ps, lr=0.1, betas=(0.8, 0.99999), weight_decay=0.3, amsgrad=True, fused=True),
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.3, fused=True),
])
def test_fused_optimizers_match_cpu(make_opt, metrics_delta):
    _step_pair(make_opt)
    assert metrics_delta()["cpu_fallbacks"] == {}


def test_fused_adam_skips_step_on_found_inf_and_unscales():
    p, g = make((4,)), make((4,), seed=1)
    results = {}
    for dev in ("cpu", "tpu"):
        ps, gs = [p.clone().to(dev)], [g.clone().to(dev)]
        m, v = [torch.zeros(4, device=dev)], [torch.zeros(4, device=dev)]
        steps = [torch.tensor(1.0, device=dev)]
        kw = dict(lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        torch._fused_adam_(ps, gs, m, v, [], steps, **kw, grad_scale=torch.tensor(4.0, device=dev),
                           found_inf=torch.tensor(1.0, device=dev))
        skipped = ps[0].clone()
        torch._fused_adam_(ps, gs, m, v, [], steps, **kw, grad_scale=torch.tensor(4.0, device=dev),
                           found_inf=torch.tensor(0.0, device=dev))
        results[dev] = (skipped, ps[0], gs[0], m[0])
    assert_same(results["tpu"][0], p)  # found_inf: untouched
    for a, b in zip(results["tpu"], results["cpu"]):
        assert_same(a, b)


def test_fused_adagrad_skips_step_on_found_inf_and_unscales():
    p, g = make((4,)), make((4,), seed=1)
    results = {}
    for dev in ("cpu", "tpu"):
        ps, gs, sums = [p.clone().to(dev)], [g.clone().to(dev)], [torch.full((4,), 0.1, device=dev)]
        steps = [torch.tensor(2.0, device=dev)]
        kw = dict(lr=0.1, lr_decay=0.2, weight_decay=0.05, eps=1e-10, maximize=True)
        torch._fused_adagrad_(ps, gs, sums, steps, **kw, grad_scale=torch.tensor(4.0, device=dev),
                              found_inf=torch.tensor(1.0, device=dev))
        skipped = ps[0].clone()
        torch._fused_adagrad_(ps, gs, sums, steps, **kw, grad_scale=torch.tensor(4.0, device=dev),
                              found_inf=torch.tensor(0.0, device=dev))
        results[dev] = (skipped, ps[0], gs[0], sums[0])
    assert_same(results["tpu"][0], p)  # found_inf: untouched
    for a, b in zip(results["tpu"], results["cpu"]):
        assert_same(a, b)


def test_optimizer_uses_foreach_by_default():
    from torch.optim.optimizer import _default_to_fused_or_foreach
    params = [tpu(make((3,))).requires_grad_()]
    fused, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    assert foreach and not fused


def test_clip_grad_norm_matches_cpu():
    gs = [make((3, 4), seed=1) * 10, make((5,), seed=2)]
    pc = [torch.zeros_like(g).requires_grad_() for g in gs]
    pt = [tpu(torch.zeros_like(g)).requires_grad_() for g in gs]
    for p, g in zip(pc, gs):
        p.grad = g.clone()
    for p, g in zip(pt, gs):
        p.grad = tpu(g)
    nc = torch.nn.utils.clip_grad_norm_(pc, 1.0)
    nt = torch.nn.utils.clip_grad_norm_(pt, 1.0)
    assert_same(nt, nc)
    for a, b in zip(pt, pc):
        assert_same(a.grad, b.grad)
