"""Small models shared by the demo, the tests and the benchmarks: an MLP, a CNN
with batch norm and a GPT (token + position embedding, causal attention, GELU
MLP, tied head). Each comes with deterministic data and an optimizer recipe, so
that the same training run can be repeated on any device."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in=32, d_hidden=64, n_classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_hidden),
                                 nn.ReLU(), nn.Dropout(0.0), nn.Linear(d_hidden, n_classes))

    def forward(self, x):
        return self.net(x)


class SmallCNN(nn.Module):
    def __init__(self, channels=3, n_classes=10, width=8):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(2 * width, n_classes)

    def forward(self, x):
        return self.head(self.features(x))


@dataclass
class GPTConfig:
    vocab: int = 64
    block: int = 16
    n_embd: int = 32
    n_head: int = 2
    n_layer: int = 2
    dropout: float = 0.0


# The wider GPT of the compile benchmarks (trained on batches of 4 x 64 tokens).
GPT_WIDE = GPTConfig(block=64, n_embd=128, n_head=4)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd), nn.Dropout(cfg.dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg=GPTConfig()):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied weights
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# ---- deterministic data ---------------------------------------------------------------------

def mlp_batch(step, batch=32, d_in=32, n_classes=10):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(batch, d_in, generator=g)
    # A learnable rule: the class is the argmax of a fixed projection.
    w = torch.randn(d_in, n_classes, generator=torch.Generator().manual_seed(7))
    return x, (x @ w).argmax(dim=1)


def cnn_batch(step, batch=8, size=16, n_classes=10):
    g = torch.Generator().manual_seed(2000 + step)
    y = torch.randint(0, n_classes, (batch,), generator=g)
    x = torch.randn(batch, 3, size, size, generator=g) * 0.5
    x[:, y % 3, :, :] += (y.float() / n_classes).view(-1, 1, 1)  # class signal in one channel
    return x, y


def gpt_text(cfg=GPTConfig(), length=4096):
    """A repeating, learnable token stream (arithmetic sequences mod vocab)."""
    g = torch.Generator().manual_seed(3)
    out, i = [], 0
    while len(out) < length:
        start, stride = torch.randint(0, cfg.vocab, (2,), generator=g).tolist()
        out.extend((start + stride * k) % cfg.vocab for k in range(cfg.block))
        i += 1
    return torch.tensor(out[:length])


def gpt_batch(step, cfg=GPTConfig(), batch=8, text=None):
    text = gpt_text(cfg) if text is None else text
    g = torch.Generator().manual_seed(4000 + step)
    starts = torch.randint(0, len(text) - cfg.block - 1, (batch,), generator=g)
    x = torch.stack([text[s:s + cfg.block] for s in starts.tolist()])
    y = torch.stack([text[s + 1:s + cfg.block + 1] for s in starts.tolist()])
    return x, y


# ---- one recipe per model: model, optimizer, loss of a batch ---------------------------------

def build(kind, seed=0):
    """(model, make_optimizer, batch_fn, loss_fn) for 'mlp', 'cnn', 'gpt' or 'gpt-wide' (on CPU)."""
    torch.manual_seed(seed)
    if kind == "mlp":
        model = MLP()
        make_opt = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)  # noqa: E731
        return model, make_opt, mlp_batch, lambda m, x, y: F.cross_entropy(m(x), y)
    if kind == "cnn":
        model = SmallCNN()
        make_opt = lambda ps: torch.optim.Adam(ps, lr=3e-3)  # noqa: E731
        return model, make_opt, cnn_batch, lambda m, x, y: F.cross_entropy(m(x), y, label_smoothing=0.1)
    if kind in ("gpt", "gpt-wide"):
        cfg, batch = (GPT_WIDE, 4) if kind == "gpt-wide" else (GPTConfig(), 8)
        model = GPT(cfg)
        text = gpt_text(cfg)
        make_opt = lambda ps: torch.optim.AdamW(ps, lr=3e-3, weight_decay=0.01)  # noqa: E731
        return model, make_opt, (lambda s: gpt_batch(s, cfg, batch, text)), lambda m, x, y: m(x, y)
    raise ValueError(f"unknown model kind {kind!r}")


def step_fn(model, opt, loss_fn, batches, params, clip=1.0, backend=None, compile_opt=True):
    """One training step as a function of the batch index: zero_grad, forward
    + loss, backward, clip_grad_norm_ + optimizer step. With `backend`, forward
    + loss is one torch.compile'd function and clip + step another (unless
    `compile_opt` is False): the benchmarks' compiled step."""
    def forward_loss(x, y):
        return loss_fn(model, x, y)

    def opt_step():
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()

    if backend:
        forward_loss = torch.compile(forward_loss, backend=backend)
        if compile_opt:
            opt_step = torch.compile(opt_step, backend=backend)

    def step(i):
        x, y = batches[i]
        opt.zero_grad(set_to_none=True)
        loss = forward_loss(x, y)
        loss.backward()
        opt_step()
        return loss
    return step


def captured_step(model, opt, loss_fn, params, clip=1.0):
    """The whole training step of a batch (zero_grad, forward + loss, backward,
    clip_grad_norm_, optimizer step) as one torch_pjrt.capture_step: replayed
    as one XLA program from its 4th call. The optimizer keeps its step count
    on the device (capturable=True), so a replay advances it."""
    import torch_pjrt

    for g in opt.param_groups:
        if "capturable" in g:
            g["capturable"] = True

    @torch_pjrt.capture_step
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        return loss
    return step


def train(kind, device, steps, seed=0, clip=1.0, on_step=None, compile_backend=None):
    """Trains from the same initial weights and data on `device`; returns the
    losses. With `compile_backend` ("tpu", "inductor"...), the model and the
    optimizer step are torch.compile'd with it (gradient clipping stays eager)."""
    model, make_opt, batch_fn, loss_fn = build(kind, seed)
    model = model.to(device)
    opt = make_opt(model.parameters())
    forward, opt_step = model, opt.step
    if compile_backend:
        forward = torch.compile(model, backend=compile_backend)
        opt_step = torch.compile(opt.step, backend=compile_backend)
    # Data is made up front on the host, so step times measure the device.
    batches = [batch_fn(step) for step in range(steps)]
    losses = []
    for step in range(steps):
        x, y = batches[step]
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(forward, x, y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt_step()
        losses.append(loss.detach())
        if on_step:
            on_step(step, loss)
    return [float(l) for l in losses]
