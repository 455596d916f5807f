"""Compiled decoding with a Python int position (Llama's reference style:
`freqs[start:start + 1]`, a static KV cache written at `start`): programs
compiled, compile seconds and time per token, with the position a runtime
input of the program (the default) against keying the program by its value
(what every int did before; `--keyed` alone runs only that). One run, same
weights and tokens; the first pass over the positions includes compiling,
the second is warm (median per token).

    python benchmarks/runtime_ints.py [--tokens 40] [--markdown]
"""
import argparse
import statistics
import time

import torch

import torch_pjrt
from torch_pjrt._compile import graph_fn


class Block(torch.nn.Module):
    def __init__(self, width=64, heads=4, capacity=128):
        super().__init__()
        self.heads, self.hd = heads, width // heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
        self.register_buffer("freqs", torch.randn(capacity, self.hd))
        self.register_buffer("ck", torch.zeros(1, capacity, heads, self.hd))
        self.register_buffer("cv", torch.zeros(1, capacity, heads, self.hd))
        self.capacity = capacity

    def forward(self, x, start):
        b, length, w = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, self.hd).unbind(2)
        rot = self.freqs[start:start + length]
        q, k = q * rot[:, None], k * rot[:, None]
        self.ck[:b, start:start + length] = k
        self.cv[:b, start:start + length] = v
        mask = torch.arange(self.capacity, device=x.device) <= start
        a = torch.einsum("blhd,bshd->bhls", q, self.ck[:b]) / self.hd ** 0.5
        a = a.masked_fill(~mask, float("-inf")).softmax(-1)
        y = self.out(torch.einsum("bhls,bshd->blhd", a, self.cv[:b]).reshape(b, length, w))
        return x + y + self.mlp(x + y)


def run(keyed, tokens, device):
    torch._dynamo.reset()
    saved = graph_fn._runtime_int_inputs
    if keyed:
        graph_fn._runtime_int_inputs = lambda gm, skip: ((), None)
    try:
        torch.manual_seed(0)
        model = Block().to(device).eval()
        step = torch.compile(model, backend="tpu") if device == "tpu" else model
        xs = [torch.randn(1, 1, 64).to(device) for _ in range(tokens)]
        m0 = torch_pjrt.metrics()
        outs = []
        with torch.no_grad():
            t0 = time.perf_counter()
            for p, x in enumerate(xs):
                outs.append(step(x, p))
            outs[-1].cpu()
            first = time.perf_counter() - t0
            m1 = torch_pjrt.metrics()
            per = []
            for p, x in enumerate(xs):
                t = time.perf_counter()
                step(x, p).cpu()
                per.append(time.perf_counter() - t)
        return dict(programs=m1["compiled_graphs"] - m0["compiled_graphs"],
                    compile_s=m1["graph_compile_seconds"] - m0["graph_compile_seconds"],
                    first_s=first, warm_ms=statistics.median(per) * 1e3, out=outs[-1].cpu())
    finally:
        graph_fn._runtime_int_inputs = saved


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    rows = [("tpu compiled, position a runtime input", run(False, args.tokens, "tpu")),
            ("tpu compiled, position keys the program", run(True, args.tokens, "tpu")),
            ("CPU eager (PyTorch)", run(False, args.tokens, "cpu"))]
    same = all(torch.allclose(r["out"], rows[-1][1]["out"], atol=1e-4) for _, r in rows)
    head = ["", "programs", "compile s", f"first {args.tokens} tokens s", "warm ms/token"]
    lines = [[name, str(r["programs"]) if "tpu" in name else "-", f"{r['compile_s']:.2f}" if "tpu" in name else "-",
              f"{r['first_s']:.2f}", f"{r['warm_ms']:.3f}"] for name, r in rows]
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        for line in [head] + lines:
            print(f"{line[0]:42s}" + "".join(f"{c:>22s}" for c in line[1:]))
    print(f"last token's output equal to CPU's (atol 1e-4): {same}")


if __name__ == "__main__":
    main()
