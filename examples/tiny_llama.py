"""A tiny Llama-style decoder (RMSNorm, rotary positions, grouped-query
attention, SwiGLU MLP) with a KV cache, and greedy generation: no
transformers needed. Used by benchmarks/fused_eager.py and the fused-eager
tests.

The cache grows by doubling its capacity (like a vector) instead of by one
position per token: within a capacity every token runs the same shapes, the
position is a device tensor (the write is an index_copy_ at it, the mask a
comparison with it), so a generated token compiles nothing new until the
cache doubles; 100 tokens see about log2(100) capacities. `cache="cat"` gives
the naive cache that concatenates one position per token (a new shape, so new
programs, every token), for comparison.

    python examples/tiny_llama.py [--device tpu] [--tokens 32] [--fused]
"""
import argparse
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    vocab: int = 256
    dim: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 2
    hidden: int = 172
    max_positions: int = 1024
    rope_theta: float = 10000.0
    eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class KVCache:
    """Per layer K and V of shape [batch, kv_heads, capacity, head_dim]; the
    number of positions written is `length` (host int: it decides shapes only
    when the capacity doubles) and `pos` (the same number, a device tensor
    that programs take as an input)."""

    def __init__(self, cfg, batch, device, mode="double", capacity=16):
        self.cfg, self.batch, self.device, self.mode = cfg, batch, device, mode
        head_dim = cfg.dim // cfg.n_head
        cap = capacity if mode == "double" else 0
        self.k = [torch.zeros(batch, cfg.n_kv_head, cap, head_dim, device=device) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(batch, cfg.n_kv_head, cap, head_dim, device=device) for _ in range(cfg.n_layer)]
        self.length = 0
        self.pos = torch.zeros((), dtype=torch.long, device=device)

    @property
    def capacity(self):
        return self.k[0].shape[2]

    def reserve(self, n):
        """Room for n more positions (doubling)."""
        if self.mode != "double":
            return
        cap = self.capacity
        while self.length + n > cap:
            cap *= 2
        if cap == self.capacity:
            return
        for store in (self.k, self.v):
            for i, old in enumerate(store):
                grown = old.new_zeros(old.shape[0], old.shape[1], cap, old.shape[3])
                grown[:, :, :old.shape[2]] = old
                store[i] = grown

    def update(self, layer, k, v):
        """Writes k, v (new positions) and returns the layer's keys, values and
        the attention mask [q, keys] (True where attended)."""
        t = k.shape[2]
        if self.mode == "cat":
            self.k[layer] = torch.cat((self.k[layer], k), dim=2)
            self.v[layer] = torch.cat((self.v[layer], v), dim=2)
            keys = self.k[layer].shape[2]
            q_pos = torch.arange(keys - t, keys, device=k.device)
            mask = torch.arange(keys, device=k.device)[None, :] <= q_pos[:, None]
            return self.k[layer], self.v[layer], mask
        index = self.pos + torch.arange(t, device=k.device)
        self.k[layer].index_copy_(2, index, k)
        self.v[layer].index_copy_(2, index, v)
        mask = torch.arange(self.capacity, device=k.device)[None, :] <= index[:, None]
        return self.k[layer], self.v[layer], mask

    def advance(self, n):
        self.length += n
        self.pos += n


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.dim // cfg.n_head
        self.q = nn.Linear(cfg.dim, cfg.n_head * self.head_dim, bias=False)
        self.k = nn.Linear(cfg.dim, cfg.n_kv_head * self.head_dim, bias=False)
        self.v = nn.Linear(cfg.dim, cfg.n_kv_head * self.head_dim, bias=False)
        self.o = nn.Linear(cfg.n_head * self.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin, cache, layer):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        keys, values, mask = cache.update(layer, k, v)
        rep = self.n_head // self.n_kv
        keys = keys.repeat_interleave(rep, dim=1)
        values = values.repeat_interleave(rep, dim=1)
        scores = (q @ keys.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ values
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.down = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(cfg.dim, cfg.eps), RMSNorm(cfg.dim, cfg.eps)
        self.attn, self.mlp = Attention(cfg), MLP(cfg)

    def forward(self, x, cos, sin, cache, layer):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, layer)
        return x + self.mlp(self.mlp_norm(x))


class TinyLlama(nn.Module):
    def __init__(self, cfg=LlamaConfig()):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        head_dim = cfg.dim // cfg.n_head
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(cfg.max_positions).float(), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos_table", angles.cos(), persistent=False)
        self.register_buffer("sin_table", angles.sin(), persistent=False)

    def forward(self, tokens, cache):
        t = tokens.shape[1]
        cache.reserve(t)
        index = cache.pos + torch.arange(t, device=tokens.device)
        cos = self.cos_table.index_select(0, index)
        sin = self.sin_table.index_select(0, index)
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i)
        cache.advance(t)
        return self.head(self.norm(x))


def build(seed=0, cfg=LlamaConfig()):
    torch.manual_seed(seed)
    model = TinyLlama(cfg)
    with torch.no_grad():  # larger weights than the default init: less flat logits
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model.eval()


def prompt(batch=1, length=8, cfg=LlamaConfig(), seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (batch, length), generator=g)


@torch.no_grad()
def generate(model, tokens, new_tokens, cache="double", on_token=None, capture=False):
    """Greedy decoding; returns [batch, prompt + new_tokens] on the model's
    device. Each token is read on the host (as a stopping check would), then
    fed back. `on_token(i)` is called after token i is known. `capture`
    (tpu): each token's step runs through torch_pjrt.capture_step, replayed as
    one program per cache capacity (the cache tensors are its arguments, so a
    doubled cache is a new signature; the host-side length is kept here,
    since a replay does not run the forward's Python)."""
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    kv = KVCache(model.cfg, tokens.shape[0], device, mode=cache)
    logits = model(tokens, kv)
    nxt = logits[:, -1].argmax(-1, keepdim=True)
    step = None
    if capture:
        import torch_pjrt

        def decode(last, pos, *layers):  # reads the cache through `kv`, whose tensors are `layers`
            return model(last, kv)[:, -1].argmax(-1, keepdim=True)
        step = torch_pjrt.capture_step(decode)
    out = [tokens]
    for i in range(new_tokens):
        nxt.cpu()  # the host read a stopping check makes every token
        out.append(nxt)
        if on_token:
            on_token(i)
        if i + 1 < new_tokens:
            if step is None:
                nxt = model(nxt, kv)[:, -1].argmax(-1, keepdim=True)
            else:
                length = kv.length + 1
                kv.reserve(1)
                nxt = step(nxt, kv.pos, *kv.k, *kv.v)
                kv.length = length  # (a replay skips the forward's own bookkeeping)
    return torch.cat(out, dim=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--fused", action="store_true", help="fused eager (tpu)")
    parser.add_argument("--capture", action="store_true", help="each token's step replayed (tpu, capture_step)")
    args = parser.parse_args()
    if args.device.startswith("tpu"):
        import torch_pjrt
    model = build().to(args.device)
    p = prompt()
    if args.fused:
        with torch_pjrt.fused():
            out = generate(model, p, args.tokens)
    else:
        out = generate(model, p, args.tokens, capture=args.capture)
    print(out.cpu().tolist())


if __name__ == "__main__":
    main()
