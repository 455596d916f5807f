"""Python ints in eager mode as runtime scalars (the default) against keying each
program by the int's value (TORCH_PJRT_RUNTIME_INTS=off, what every int did before).

Two parts, each run in a fresh process per setting with its own empty persistent cache:
- ops called with 100 different ints (x + n, x < n, clamp(max=n), masked_fill(m, n), ...):
  programs compiled and seconds for the 100 calls;
- eager decoding with an int position (a decoder block with a static KV cache, Llama's
  reference style: `arange(capacity) <= start`, `freqs[start:start + 1]`), strict and
  fused (each token a `torch_pjrt.fused()` region), each in its own processes: programs
  compiled (op programs and fused ones), seconds for the first pass over the positions
  (compiles included) and the warm median per token (a second pass).

    python benchmarks/int_scalars.py [--tokens 40] [--markdown]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from bench import print_table

CHILD = r'''
import json, statistics, sys, time
import torch, torch_pjrt

tokens, part = int(sys.argv[1]), sys.argv[2]
M = torch_pjrt.metrics
out = {}

def sync():
    torch.tpu.synchronize()

# ---- ops over 100 ints ----
src = torch.arange(800.0, device="tpu").reshape(100, 8)
i64 = torch.arange(800, device="tpu").reshape(100, 8)
m = src > 300
ops = {
    "x + n": lambda n: src + n,
    "x < n": lambda n: src < n,
    "i64 // n": lambda n: i64 // (n + 1),
    "clamp(max=n)": lambda n: src.clamp(max=n),
    "masked_fill(m, n)": lambda n: src.masked_fill(m, n),
    "add(y, alpha=n)": lambda n: src.add(src, alpha=n + 2),
    "i64.fill_(n)": lambda n: i64.clone().fill_(n),
    "where(m, x, n)": lambda n: torch.where(m, src, n),
}
for name, f in (ops.items() if part == "ops" else ()):
    f(0); f(1); sync()
    c0, t0 = M()["xla_compiles"], time.perf_counter()
    for n in range(2, 102):
        f(n)
    sync()
    out[name] = dict(programs=M()["xla_compiles"] - c0, seconds=time.perf_counter() - t0)

# ---- eager decoding with an int position ----
sys.path.insert(0, sys.argv[3])
from runtime_ints import Block  # (the compiled-graph benchmark's decoder block)

def decode(model, xs, fused):
    ys = []
    for p, x in enumerate(xs):
        if fused:
            with torch_pjrt.fused():
                y = model(x, p)
        else:
            y = model(x, p)
        ys.append(y.sum().item())
    return ys

torch.manual_seed(0)
model_cpu = Block().eval()
xs_cpu = [torch.randn(1, 1, 64) for _ in range(tokens)]
with torch.no_grad():
    want = decode(model_cpu, xs_cpu, False)
for mode in (() if part == "ops" else (part,)):
    model = Block().eval()
    model.load_state_dict(model_cpu.state_dict())
    model = model.to("tpu")
    xs = [x.to("tpu") for x in xs_cpu]
    with torch.no_grad():
        c0, f0, t0 = M()["xla_compiles"], M()["fused_programs_compiled"], time.perf_counter()
        got = decode(model, xs, mode == "fused")
        first = time.perf_counter() - t0
        programs = M()["xla_compiles"] - c0
        fused_programs = M()["fused_programs_compiled"] - f0
        per = []
        for p, x in enumerate(xs):
            t = time.perf_counter()
            if mode == "fused":
                with torch_pjrt.fused():
                    model(x, p).sum().item()
            else:
                model(x, p).sum().item()
            per.append(time.perf_counter() - t)
    err = max(abs(a - b) for a, b in zip(got, want))
    out["decode " + mode] = dict(programs=programs, fused=fused_programs, seconds=first, warm_ms=statistics.median(per) * 1e3,
                                 max_err=err)
print("RESULT " + json.dumps(out))
'''


def child(setting, tokens, part):
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCH_PJRT_RUNTIME_INTS=setting, TORCH_PJRT_CACHE_DIR=cache,
                   TF_CPP_MIN_LOG_LEVEL="2")
        r = subprocess.run([sys.executable, "-c", CHILD, str(tokens), part, os.path.dirname(os.path.abspath(__file__))], env=env, capture_output=True, text=True,
                           timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"child ({setting}) failed:\n{r.stderr[-3000:]}")
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    runtime, keyed = {}, {}
    for part in ("ops", "strict", "fused"):  # (each in its own processes: nothing compiled before)
        runtime.update(child("on", a.tokens, part))
        keyed.update(child("off", a.tokens, part))
    rows = []
    for name in runtime:
        r, k = runtime[name], keyed[name]
        warm = f"{r['warm_ms']:.3f} / {k['warm_ms']:.3f}" if "warm_ms" in r else ""
        err = f"{max(r['max_err'], k['max_err']):.1e}" if "max_err" in r else ""
        progs = [f"{x['programs']} ({x['fused']} fused)" if x.get("fused") else str(x["programs"]) for x in (r, k)]
        rows.append([name, *progs, f"{r['seconds']:.2f}", f"{k['seconds']:.2f}",
                     warm, err])
    head = ["what", "XLA compiles (runtime ints)", "XLA compiles (keyed)", "seconds (runtime)", "seconds (keyed)",
            "warm ms/token (runtime / keyed)", "max |err| vs CPU"]
    print_table(head, rows, [""] * len(head), a.markdown)
    print(f"(ops: 100 calls with ints 2..101 after two warm-up calls; decoding: {a.tokens} tokens, one "
          f"process per setting, each with an empty persistent cache)")


if __name__ == "__main__":
    main()
