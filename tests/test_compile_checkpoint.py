"""Activation checkpointing under torch.compile(backend="tpu") with random
ops: the backward graph recomputes a checkpointed dropout with the forward's
random state (run_and_save_rng_state / run_with_rng_state, which PyTorch
implements for CPU, CUDA, HPU and XPU only; torch_pjrt/_compile/rng_state.py).
With one seed, compiled-and-checkpointed training draws exactly what eager
draws, so losses and gradients equal eager tpu's (float32, 1e-6 absolute)."""
import copy

import numpy as np
import pytest
import torch
from torch.utils.checkpoint import checkpoint

import torch_pjrt

DEV = "tpu"


@torch.library.custom_op("pjrt_ckpt_test::numpy_scale", mutates_args=())
def numpy_scale(x: torch.Tensor) -> torch.Tensor:
    # Through numpy: never traced into a program, so the graph runs in pieces.
    return torch.from_numpy(x.detach().cpu().numpy() * 1.5).to(x.device)


@numpy_scale.register_fake
def _(x):
    return torch.empty_like(x)


numpy_scale.register_autograd(lambda ctx, g: g * 1.5)


@torch.library.custom_op("pjrt_ckpt_test::scale_numpy_grad", mutates_args=())
def scale_numpy_grad(x: torch.Tensor) -> torch.Tensor:
    return x * 1.5


@scale_numpy_grad.register_fake
def _(x):
    return torch.empty_like(x)


# Its forward is traced into the program; its backward (numpy) cuts the backward graph.
scale_numpy_grad.register_autograd(lambda ctx, g: numpy_scale(g))


class Block(torch.nn.Module):
    def __init__(self, scale=None):
        super().__init__()
        self.a, self.b, self.scale = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), scale

    def inner(self, x):
        h = torch.nn.functional.dropout(torch.tanh(self.a(x)), 0.3, training=True)
        if self.scale is not None:
            h = SCALES[self.scale](h)
        return torch.nn.functional.dropout(self.b(h), 0.2, training=True)

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False).square().mean()


def _step(model, x, compiled):
    torch._dynamo.reset()
    fn = torch.compile(model, backend="tpu") if compiled else model
    torch.manual_seed(11)
    loss = fn(x)
    loss.backward()
    grads = [p.grad.cpu() for p in model.parameters()] + [x.grad.cpu()]
    return loss.item(), grads


# (scale op, graphs run in pieces): both graphs whole programs (the random
# state a program value on both sides); both in pieces (the eager state on
# both sides: the numpy op runs again in the recomputation); the forward a
# program and the backward in pieces (a program's state replayed eagerly).
SCALES = {"numpy": numpy_scale, "numpy_grad": scale_numpy_grad}


@pytest.mark.parametrize("scale,partitioned", [(None, 0), ("numpy", 2), ("numpy_grad", 1)],
                         ids=["one-program", "both-in-pieces", "backward-in-pieces"])
def test_checkpointed_dropout_compiled_draws_what_eager_draws(scale, partitioned):
    torch.manual_seed(0)
    block = Block(scale)
    x = torch.randn(8, 16)
    runs = []
    for compiled in (False, True):
        model = copy.deepcopy(block).to(DEV)
        before = torch_pjrt.metrics().get("partitioned_graphs", 0)
        runs.append(_step(model, x.to(DEV).requires_grad_(), compiled))
    assert torch_pjrt.metrics().get("partitioned_graphs", 0) - before == partitioned
    (loss_e, grads_e), (loss_c, grads_c) = runs
    assert loss_c == pytest.approx(loss_e, abs=1e-6)
    for ge, gc in zip(grads_e, grads_c):
        torch.testing.assert_close(gc, ge, atol=1e-6, rtol=1e-5)
    # The masks were really random (not all kept): some input gradients are zero-free mixes.
    assert 0 < loss_e and grads_e[-1].abs().sum() > 0


def test_the_saved_state_is_the_key_and_replays_the_same_mask():
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
    x = torch.ones(4000, device=DEV)
    state, (out, mask) = run_and_save_rng_state(torch.ops.aten.native_dropout.default, x, 0.5, True)
    assert state.device.type == DEV and state.dtype == torch.int64 and state.shape == (2,)
    again, mask2 = run_with_rng_state(state, torch.ops.aten.native_dropout.default, x, 0.5, True)
    assert torch.equal(mask.cpu(), mask2.cpu()) and torch.equal(out.cpu(), again.cpu())
    assert 1500 < int(mask.sum()) < 2500
    fresh, _ = torch.ops.aten.native_dropout.default(x, 0.5, True)  # the generator moved on
    assert not torch.equal(fresh.cpu(), out.cpu())
    with pytest.raises(RuntimeError, match="s64\\[2\\] key"):
        run_with_rng_state(torch.get_rng_state(), torch.ops.aten.native_dropout.default, x, 0.5, True)


def test_hf_bert_with_gradient_checkpointing_trains_compiled_as_eager():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64,
                                  hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2)
    torch.manual_seed(0)
    base = transformers.BertForSequenceClassification(cfg).train()
    ids, labels = torch.randint(0, 100, (2, 16)), torch.tensor([0, 1])
    results = []
    for ckpt, compiled in ((False, False), (True, True)):
        torch._dynamo.reset()
        model = copy.deepcopy(base).to(DEV).train()
        if ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        fn = torch.compile(model, backend="tpu") if compiled else model
        torch.manual_seed(7)
        out = fn(input_ids=ids.to(DEV), labels=labels.to(DEV))
        out.loss.backward()
        results.append((out.loss.item(), torch.cat([p.grad.flatten().cpu() for p in model.parameters()
                                                    if p.grad is not None])))
    assert results[1][0] == pytest.approx(results[0][0], abs=1e-6)
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-6, rtol=1e-5)


# Random ops of other kinds in a checkpointed region: lowered (rand, randint,
# randn_like, randperm), drawn eagerly with a device= argument only (randperm:
# it crashed, PyTorch's dispatch of the random state looking for tensors), or
# on the CPU (poisson: the CPU fallback seeds its generator from the forced
# key, else the recomputation drew other numbers). Each backward must use the
# forward's draw: the gradient is known from the output.
REGIONS = {
    "rand": (lambda x: x * torch.rand(x.shape, device=x.device), lambda x, out: out / x),
    "randint": (lambda x: x * torch.randint(1, 5, x.shape, device=x.device), lambda x, out: out / x),
    "randn_like": (lambda x: x * torch.randn_like(x), lambda x, out: out / x),
    "poisson (CPU)": (lambda x: x * torch.poisson(torch.full_like(x, 2.0)), lambda x, out: out / x),
    "randperm": (lambda x: x * torch.randperm(x.numel(), device=x.device).reshape(x.shape).float(),
                 lambda x, out: out / x),
}


@pytest.mark.parametrize("backend", ["tpu", "aot_eager"])
@pytest.mark.parametrize("name", list(REGIONS))
def test_random_ops_recomputed_in_the_backward_draw_the_forwards_numbers(name, backend):
    region, expected_grad = REGIONS[name]
    torch._dynamo.reset()
    x = (torch.rand(6, 4, generator=torch.Generator().manual_seed(0)) + 0.5).to(DEV).requires_grad_()
    fn = torch.compile(lambda t: checkpoint(region, t, use_reentrant=False), backend=backend)
    torch.manual_seed(5)
    out = fn(x)
    out.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), expected_grad(x.detach(), out.detach()).cpu(), atol=1e-5, rtol=1e-5)
    assert len(torch.unique(out.detach().cpu())) > 3  # really random
