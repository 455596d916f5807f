"""The main demo: a small GPT trains on `tpu`, eagerly (op by op) and with
torch.compile(backend="tpu") (whole graphs as one XLA program each).

1. Forward check: the GPT's logits on tpu against PyTorch on CPU, same weights.
2. Training, eager then compiled, from the same weights and data, with a
   progress bar (loss, steps/s); first-step losses are checked against CPU.
3. Summary: for both ways, first-step time (compiles included) and warm step
   time (median) reported apart, the compile cost, and the persistent
   executable cache: run the demo a second time and the programs are loaded
   from it instead of compiled (a warm-cache start).

    python examples/demo.py [--steps N]
"""
import argparse
import os
import statistics
import sys
import time

import torch

import torch_pjrt
import torch_pjrt.cache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def progress(step, total, loss, rate, width=30):
    done = int(width * (step + 1) / total)
    bar = "#" * done + "." * (width - done)
    end = "\n" if step + 1 == total or not sys.stdout.isatty() and (step + 1) % 50 else "\r"
    if sys.stdout.isatty() or (step + 1) % 50 == 0 or step + 1 == total:
        print(f"  [{bar}] step {step + 1:4d}/{total}  loss {loss:.4f}  {rate:6.1f} steps/s",
              end=end if sys.stdout.isatty() else "\n", flush=True)


def forward_check():
    model, _, batch_fn, _ = models.build("gpt", seed=0)
    x, _ = batch_fn(0)
    with torch.no_grad():
        expected = model(x)
        actual = model.to("tpu")(x.to("tpu")).cpu()
    diff = (actual - expected).abs().max().item()
    print(f"GPT forward: max |tpu - cpu| = {diff:.2e} over logits {tuple(expected.shape)}")
    return diff


def train(steps, compile_backend=None):
    times, losses = [], []
    m0 = torch_pjrt.metrics()
    first = {}

    def on_step(step, loss):
        value = loss.item()  # a host read: the step has finished
        times.append(time.perf_counter())
        losses.append(value)
        if step == 0:
            m1 = torch_pjrt.metrics()
            first.update({k: m1[k] - m0[k] for k in
                          ("xla_compiles", "persistent_cache_hits", "compiled_graphs", "graph_compile_seconds")})
        window = times[-20:]
        rate = (len(window) - 1) / (window[-1] - window[0]) if len(window) > 1 else 0.0
        progress(step, steps, value, rate)

    start = time.perf_counter()
    models.train("gpt", "tpu", steps, on_step=on_step, compile_backend=compile_backend)
    step_times = [times[0] - start] + [b - a for a, b in zip(times, times[1:])]
    warm = statistics.median(step_times[5:]) if len(step_times) > 6 else step_times[-1]
    return {"losses": losses, "first": step_times[0], "warm": warm, **first}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    info = torch_pjrt.plugin_info()
    print(f"torch_pjrt on PJRT plugin '{info['name']}' (platform {info['platform']}, "
          f"C API {info['api_version'][0]}.{info['api_version'][1]}), "
          f"{torch.tpu.device_count()} device(s), torch {torch.__version__}")
    cache = torch_pjrt.cache.cache_dir()
    n_cached = len(torch_pjrt.cache.entries()) if cache else 0
    print(f"persistent executable cache: {cache or 'off'} ({n_cached} programs in it at start)")
    cfg = models.GPTConfig()
    print(f"GPT: vocab {cfg.vocab}, context {cfg.block}, width {cfg.n_embd}, {cfg.n_layer} layers, "
          f"{cfg.n_head} heads, tied head; AdamW, grad clipping, batch 8")
    diff = forward_check()

    cpu_first = models.train("gpt", "cpu", 1)[0]
    runs = {}
    for name, backend in (("eager", None), ("compiled", "tpu")):
        print(f"training {args.steps} steps on tpu, {name}"
              f"{' (torch.compile(model) and torch.compile(opt.step), backend=tpu)' if backend else ' (op by op)'}:")
        runs[name] = train(args.steps, backend)
    eager, compiled = runs["eager"], runs["compiled"]

    print()
    print(f"first-step loss: eager {eager['losses'][0]:.6f}, compiled {compiled['losses'][0]:.6f}, "
          f"cpu {cpu_first:.6f}")
    print(f"loss after {args.steps} steps (mean of the last 10): eager {statistics.mean(eager['losses'][-10:]):.4f}, "
          f"compiled {statistics.mean(compiled['losses'][-10:]):.4f}")
    print(f"{'':10s} {'first step (compile)':>21s} {'warm step (median)':>19s} {'steps/s':>8s} "
          f"{'XLA compiles':>12s} {'loaded from cache':>17s}")
    for name, r in runs.items():
        print(f"{name:10s} {r['first'] * 1e3:18.0f} ms {r['warm'] * 1e3:16.2f} ms {1 / r['warm']:8.1f} "
              f"{r['xla_compiles']:12d} {r['persistent_cache_hits']:17d}")
    cost = compiled["first"] - compiled["warm"]
    print(f"compiled vs eager, warm step: {eager['warm'] / compiled['warm']:.2f}x")
    print(f"compile cost of the compiled first step: {cost:.2f} s = {compiled['compiled_graphs']} graphs lowered "
          f"and XLA-compiled (or loaded) in {compiled['graph_compile_seconds']:.2f} s + Dynamo/AOTAutograd "
          f"tracing and the eager parts {cost - compiled['graph_compile_seconds']:.2f} s")
    m = torch_pjrt.metrics()
    loaded, compiled_n = m["persistent_cache_hits"], m["xla_compiles"]
    if compiled_n == 0 and loaded:
        print(f"warm-cache start: all {loaded} programs were loaded from {cache}, none compiled")
    elif cache:
        print(f"this run compiled {compiled_n} programs and saved them in {cache}; "
              f"run the demo again for a warm-cache start")
    print(f"CPU fallbacks: {m['cpu_fallbacks'] or 'none'}")
    if diff > 1e-4 or max(abs(r["losses"][0] - cpu_first) for r in runs.values()) > 1e-4:
        raise SystemExit("tpu results differ from CPU")


if __name__ == "__main__":
    main()
