"""The main demo: an MLP and a transformer block run forward on `tpu` and on CPU.

For each model it prints the largest difference from CPU, the first-call time
(compiles included) and the warm time (median of repeated calls), each on its
own line, then what the backend compiled.
"""
import math
import statistics
import time

import torch
import torch.nn as nn

import torch_pjrt


class MLP(nn.Module):
    def __init__(self, d_in=256, d_hidden=1024, d_out=256):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm block: causal self-attention and a GELU MLP, with residuals."""

    def __init__(self, d_model=256, n_heads=8, d_ff=1024):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, d_ff, d_model)

    def attention(self, x):
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        weights = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(out)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def timed(fn, sync):
    start = time.perf_counter()
    out = fn()
    sync(out)
    return out, time.perf_counter() - start


def run(name, model, x, warm_runs=20):
    cpu_sync = lambda out: None  # noqa: E731
    tpu_sync = lambda out: out.cpu()  # noqa: E731  (a host read waits for the result)
    with torch.no_grad():
        expected, _ = timed(lambda: model(x), cpu_sync)
        cpu_times = [timed(lambda: model(x), cpu_sync)[1] for _ in range(warm_runs)]

        model_tpu = model.to("tpu")
        x_tpu = x.to("tpu")
        compiles_before = torch_pjrt.metrics()["xla_compiles"]
        actual, first = timed(lambda: model_tpu(x_tpu), tpu_sync)
        compiles = torch_pjrt.metrics()["xla_compiles"] - compiles_before
        tpu_times = [timed(lambda: model_tpu(x_tpu), tpu_sync)[1] for _ in range(warm_runs)]
        model.to("cpu")

    diff = (actual.cpu() - expected).abs().max().item()
    print(f"{name}: max |tpu - cpu| = {diff:.3e}")
    print(f"{name}: tpu first call (compiles included) = {first * 1e3:.1f} ms ({compiles} programs compiled)")
    print(f"{name}: tpu warm call (median of {warm_runs}) = {statistics.median(tpu_times) * 1e3:.2f} ms")
    print(f"{name}: cpu warm call (median of {warm_runs}) = {statistics.median(cpu_times) * 1e3:.2f} ms")
    return diff


def main():
    torch.manual_seed(0)
    info = torch_pjrt.plugin_info()
    print(f"torch_pjrt on PJRT plugin '{info['name']}' (platform {info['platform']}, "
          f"C API {info['api_version'][0]}.{info['api_version'][1]}), "
          f"{torch.tpu.device_count()} device(s), torch {torch.__version__}")
    diffs = [
        run("MLP", MLP(), torch.randn(64, 256)),
        run("TransformerBlock", TransformerBlock(), torch.randn(4, 64, 256)),
    ]
    m = torch_pjrt.metrics()
    print(f"programs compiled: {m['xla_compiles']} ({m['compile_seconds']:.2f} s), "
          f"executions: {m['executions']}, cache hits: {m['executable_cache_hits']}")
    if max(diffs) > 1e-3:
        raise SystemExit(f"results differ from CPU by {max(diffs):.3e}")


if __name__ == "__main__":
    main()
