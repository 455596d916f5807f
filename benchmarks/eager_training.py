"""Eager training throughput, tpu against PyTorch eager on CPU (or --baseline
cuda on a GPU machine), in one run.

For the MLP, the CNN and the GPT of examples/models.py: the first step
(compiles included) and the warm step time (median over steps after a
warm-up), as steps/s. Then the per-op dispatch overhead on small tensors:
the median time of one small op on each device (tpu: launched asynchronously,
and launched + waited for).

    python benchmarks/eager_training.py [--steps N] [--markdown]
"""
import argparse
import os
import statistics
import sys
import time

import torch

import torch_pjrt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import models  # noqa: E402


def sync(device):
    if device == "tpu":
        torch.tpu.synchronize()
    elif device == "cuda":
        torch.cuda.synchronize()


def step_times(kind, device, steps):
    times = []
    last = [time.perf_counter()]

    def on_step(step, loss):
        loss.item()  # waits for the step
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    compiles = torch_pjrt.metrics()["xla_compiles"]
    models.train(kind, device, steps, on_step=on_step)
    return times, torch_pjrt.metrics()["xla_compiles"] - compiles


def per_op(device, n=2000):
    x = torch.ones(16, device=device)
    y = torch.ones(16, device=device)
    for _ in range(20):  # compile and warm up
        torch.add(x, y)
    sync(device)
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            torch.add(x, y)
        sync(device)
        samples.append((time.perf_counter() - start) / n)
    launched = statistics.median(samples)
    waited = []
    for _ in range(200):
        start = time.perf_counter()
        z = torch.add(x, y)
        sync(device)
        waited.append(time.perf_counter() - start)
    return launched, statistics.median(waited)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--baseline", default="cpu", help="PyTorch eager device to compare with (cpu, cuda)")
    args = parser.parse_args()
    info = torch_pjrt.plugin_info()
    print(f"plugin '{info['name']}' ({info['platform']}), torch {torch.__version__}, "
          f"{os.cpu_count()} CPU cores, {args.steps} steps per run, warm = median of steps 6..N")
    rows = []
    for kind in ("mlp", "cnn", "gpt"):
        cpu, _ = step_times(kind, args.baseline, args.steps)
        tpu, compiles = step_times(kind, "tpu", args.steps)
        fallbacks = torch_pjrt.metrics()["cpu_fallbacks"]
        rows.append((kind, tpu[0], compiles, statistics.median(tpu[5:]), statistics.median(cpu[5:]), fallbacks))
    sep = "|" if args.markdown else " "
    base = args.baseline
    head = ["model", "tpu first step (ms)", "programs compiled", "tpu warm step (ms)", "tpu steps/s",
            f"{base} warm step (ms)", f"{base} steps/s", f"tpu/{base} time"]
    fmt = lambda cells: (sep + sep.join(f" {c} " for c in cells) + sep) if args.markdown else "  ".join(f"{c:>12}" for c in cells)  # noqa: E731
    print(fmt(head))
    if args.markdown:
        print("|" + "---|" * len(head))
    for kind, first, compiles, warm_t, warm_c, _ in rows:
        print(fmt([kind, f"{first * 1e3:.0f}", compiles, f"{warm_t * 1e3:.1f}", f"{1 / warm_t:.1f}",
                   f"{warm_c * 1e3:.1f}", f"{1 / warm_c:.1f}", f"{warm_t / warm_c:.1f}x"]))
    print(f"CPU fallbacks during the tpu runs: {rows[-1][-1] or 'none'}")
    print()
    head = ["device", "per-op launch (us)", "per-op launch + wait (us)"]
    print(fmt(head))
    if args.markdown:
        print("|" + "---|" * len(head))
    for device in (base, "tpu"):
        launched, waited = per_op(device)
        print(fmt([device, f"{launched * 1e6:.1f}", f"{waited * 1e6:.1f}"]))


if __name__ == "__main__":
    main()
