"""The GPT of examples/models.py written in plain JAX (jax.numpy, no flax), as
the reference for what XLA itself reaches on this machine (used by
benchmarks/compile_bench.py, config "jax jit").

Same configuration as models.GPTConfig (vocab 64, block 16, width 32, 2 heads,
2 layers, batch 8): token + position embedding, pre-norm blocks of causal
self-attention and a tanh-GELU MLP, final layer norm, head tied to the token
embedding, mean cross-entropy. The weights are the torch model's: pass the
torch state_dict as numpy arrays (`params_from_state_dict`). The train step is
the recipe of models.train for the GPT: value_and_grad, gradient clipping to
norm 1.0 (torch.nn.utils.clip_grad_norm_), then AdamW (lr 3e-3, betas
0.9/0.999, eps 1e-8, weight decay 0.01 on every parameter) written by hand,
following torch.optim.AdamW's update.

    python benchmarks/jax_gpt.py --check   # JAX loss == torch CPU loss (1e-4 relative), a few train steps too

This module imports only jax and numpy; --check also imports torch.
"""
import math
import os
import sys
from dataclasses import dataclass
from functools import partial

import numpy as np

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class Config:  # mirrors examples/models.py GPTConfig
    vocab: int = 64
    block: int = 16
    n_embd: int = 32
    n_head: int = 2
    n_layer: int = 2


WIDE = Config(block=64, n_embd=128, n_head=4)  # mirrors models.GPT_WIDE

LN_EPS = 1e-5  # torch.nn.LayerNorm's default
LR, BETA1, BETA2, ADAM_EPS, WEIGHT_DECAY = 3e-3, 0.9, 0.999, 1e-8, 0.01  # models.build("gpt")
CLIP = 1.0  # models.train's clip

# torch state_dict name -> (block-local) JAX parameter name. head.weight is tied to tok.weight.
_BLOCK_NAMES = {
    "ln1.weight": "ln1_w", "ln1.bias": "ln1_b",
    "attn.qkv.weight": "qkv_w", "attn.qkv.bias": "qkv_b",
    "attn.proj.weight": "proj_w", "attn.proj.bias": "proj_b",
    "ln2.weight": "ln2_w", "ln2.bias": "ln2_b",
    "mlp.0.weight": "fc_w", "mlp.0.bias": "fc_b",
    "mlp.2.weight": "out_w", "mlp.2.bias": "out_b",
}
_TOP_NAMES = {"tok.weight": "tok", "pos.weight": "pos", "ln_f.weight": "lnf_w", "ln_f.bias": "lnf_b"}


def params_from_state_dict(state, cfg=Config()):
    """JAX parameter pytree from a torch GPT state_dict given as name -> numpy array
    (linear weights keep torch's (out, in) layout)."""
    params = {v: jnp.asarray(np.asarray(state[k], dtype=np.float32)) for k, v in _TOP_NAMES.items()}
    params["blocks"] = [
        {v: jnp.asarray(np.asarray(state[f"blocks.{i}.{k}"], dtype=np.float32)) for k, v in _BLOCK_NAMES.items()}
        for i in range(cfg.n_layer)]
    if "head.weight" in state:  # tied: must be the same values as tok.weight
        assert np.array_equal(np.asarray(state["head.weight"]), np.asarray(state["tok.weight"]))
    return params


def params_to_state_dict(params):
    """torch names -> numpy arrays (head.weight omitted: it is tok.weight)."""
    out = {k: np.asarray(params[v]) for k, v in _TOP_NAMES.items()}
    for i, blk in enumerate(params["blocks"]):
        out.update({f"blocks.{i}.{k}": np.asarray(blk[v]) for k, v in _BLOCK_NAMES.items()})
    return out


# ---- model ----------------------------------------------------------------------------------

def _linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def _layer_norm(x, w, b):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)  # biased, as torch
    return (x - mean) * jax.lax.rsqrt(var + LN_EPS) * w + b


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _attention(p, x, n_head):
    b, t, d = x.shape
    hd = d // n_head
    qkv = _linear(x, p["qkv_w"], p["qkv_b"])
    q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    q, k, v = (z.reshape(b, t, n_head, hd).transpose(0, 2, 1, 3) for z in (q, k, v))
    scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(hd))
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(causal, scores, -jnp.inf)
    scores = scores - jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    att = jnp.exp(scores)
    att = att / jnp.sum(att, axis=-1, keepdims=True)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return _linear(y, p["proj_w"], p["proj_b"])


def forward(params, idx, cfg=Config()):
    """Logits (batch, time, vocab) of int token ids (batch, time)."""
    t = idx.shape[1]
    x = params["tok"][idx] + params["pos"][jnp.arange(t)][None]
    for p in params["blocks"]:
        x = x + _attention(p, _layer_norm(x, p["ln1_w"], p["ln1_b"]), cfg.n_head)
        h = _layer_norm(x, p["ln2_w"], p["ln2_b"])
        x = x + _linear(_gelu_tanh(_linear(h, p["fc_w"], p["fc_b"])), p["out_w"], p["out_b"])
    x = _layer_norm(x, params["lnf_w"], params["lnf_b"])
    return _linear(x, params["tok"])  # tied head, no bias


def loss_fn(params, idx, targets, cfg=Config()):
    """Mean cross-entropy over every position (F.cross_entropy of the flattened logits)."""
    logits = forward(params, idx, cfg).reshape(-1, cfg.vocab)
    targets = targets.reshape(-1)
    m = jnp.max(logits, axis=-1, keepdims=True)
    lse = jnp.log(jnp.sum(jnp.exp(logits - m), axis=-1)) + m[:, 0]
    picked = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    return jnp.mean(lse - picked)


# ---- optimizer: clip_grad_norm_ + AdamW, as torch does them -----------------------------------

def init_opt_state(params):
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    return {"step": jnp.zeros((), jnp.float32), "m": zeros, "v": jax.tree_util.tree_map(jnp.zeros_like, params)}


def _clip(grads, max_norm=CLIP):
    leaves = jax.tree_util.tree_leaves(grads)
    total = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in leaves))
    coef = jnp.minimum(max_norm / (total + 1e-6), 1.0)
    return jax.tree_util.tree_map(lambda g: g * coef, grads)


def _adamw(params, grads, state):
    step = state["step"] + 1.0
    bc1 = 1.0 - BETA1 ** step
    bc2_sqrt = jnp.sqrt(1.0 - BETA2 ** step)
    step_size = LR / bc1

    def upd(p, g, m, v):
        p = p * (1.0 - LR * WEIGHT_DECAY)
        m = m + (1.0 - BETA1) * (g - m)  # exp_avg.lerp_(grad, 1 - beta1)
        v = v * BETA2 + (1.0 - BETA2) * g * g
        p = p - step_size * m / (jnp.sqrt(v) / bc2_sqrt + ADAM_EPS)
        return p, m, v

    out = jax.tree_util.tree_map(upd, params, grads, state["m"], state["v"])
    is_triple = lambda x: isinstance(x, tuple)  # noqa: E731
    pick = lambda i: jax.tree_util.tree_map(lambda t: t[i], out, is_leaf=is_triple)  # noqa: E731
    return pick(0), {"step": step, "m": pick(1), "v": pick(2)}


def train_step(params, opt_state, idx, targets, cfg=Config()):
    """One step: loss, gradients, clip, AdamW. Returns (params, opt_state, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, idx, targets, cfg)
    params, opt_state = _adamw(params, _clip(grads), opt_state)
    return params, opt_state, loss


def jitted(cfg=Config()):
    """(jit(forward), jit(train_step) with params and optimizer state donated)."""
    return (jax.jit(partial(forward, cfg=cfg)),
            jax.jit(partial(train_step, cfg=cfg), donate_argnums=(0, 1)))


# ---- self-check against the torch model -------------------------------------------------------

def _check(steps=5):
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    import models

    model, make_opt, batch_fn, torch_loss = models.build("gpt")
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    params = params_from_state_dict(state)
    fwd, step_fn = jitted()

    x, y = batch_fn(0)
    with torch.no_grad():
        t_logits = model(x).numpy()
        t_loss = float(torch_loss(model, x, y))
    xj, yj = jnp.asarray(x.numpy(), jnp.int32), jnp.asarray(y.numpy(), jnp.int32)
    j_logits = np.asarray(fwd(params, xj))
    j_loss = float(jax.jit(loss_fn)(params, xj, yj))
    rel = abs(j_loss - t_loss) / abs(t_loss)
    print(f"forward: max |jax - torch| over logits {j_logits.shape} = {np.max(np.abs(j_logits - t_logits)):.3g}")
    print(f"loss: jax {j_loss:.7f}, torch cpu {t_loss:.7f}, relative diff {rel:.2e}")
    assert rel <= 1e-4, f"JAX loss {j_loss} differs from torch CPU loss {t_loss} by {rel:.2e} relative"

    # A few train steps with the models.train recipe (clip 1.0, AdamW) on both.
    t_losses = models.train("gpt", "cpu", steps)
    opt_state = init_opt_state(params)
    j_losses = []
    for s in range(steps):
        x, y = batch_fn(s)
        params, opt_state, loss = step_fn(params, opt_state, jnp.asarray(x.numpy(), jnp.int32),
                                          jnp.asarray(y.numpy(), jnp.int32))
        j_losses.append(float(loss))
    worst = max(abs(a - b) / abs(b) for a, b in zip(j_losses, t_losses))
    print(f"{steps} train steps: jax {[round(v, 5) for v in j_losses]}")
    print(f"               torch {[round(v, 5) for v in t_losses]}  max relative diff {worst:.2e}")
    assert worst <= 1e-4, f"train-step losses differ by {worst:.2e} relative"
    # Parameters after the steps, against a torch replay of models.train.
    model, make_opt, _, _ = models.build("gpt")
    opt = make_opt(model.parameters())
    for s in range(steps):
        x, y = batch_fn(s)
        opt.zero_grad(set_to_none=True)
        torch_loss(model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
    got = params_to_state_dict(params)
    diff = max(float(np.max(np.abs(got[k] - v.detach().numpy()))) for k, v in model.state_dict().items()
               if k != "head.weight")
    print(f"parameters after {steps} steps: max |jax - torch| = {diff:.3g}")
    assert diff <= 1e-4, f"parameters differ by {diff:.3g} after {steps} steps"
    print("OK")


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        _check()
    else:
        print(__doc__)
