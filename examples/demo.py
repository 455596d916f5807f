"""The main demo: a small GPT trains on `tpu`, eagerly, op by op.

1. Forward check: the GPT's logits on tpu against PyTorch on CPU, same weights.
2. Training: a few hundred AdamW steps on tpu with a progress bar (loss,
   steps/s); the first step's loss is compared with the same step on CPU.
3. Summary: first-step time (compiles included) and warm step time (median)
   reported apart, programs compiled, CPU fallbacks (should be none).

    python examples/demo.py [--steps N]
"""
import argparse
import os
import statistics
import sys
import time

import torch

import torch_pjrt

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


def train(steps):
    times, losses = [], []
    compiles0 = torch_pjrt.metrics()["xla_compiles"]
    first_compiles = None

    def on_step(step, loss):
        nonlocal first_compiles
        value = loss.item()  # a host read: the step has finished
        times.append(time.perf_counter())
        losses.append(value)
        if step == 0:
            first_compiles = torch_pjrt.metrics()["xla_compiles"] - compiles0
        window = times[-20:]
        rate = (len(window) - 1) / (window[-1] - window[0]) if len(window) > 1 else 0.0
        progress(step, steps, value, rate)

    start = time.perf_counter()
    models.train("gpt", "tpu", steps, on_step=on_step)
    step_times = [times[0] - start] + [b - a for a, b in zip(times, times[1:])]
    return losses, step_times, first_compiles


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    info = torch_pjrt.plugin_info()
    print(f"torch_pjrt on PJRT plugin '{info['name']}' (platform {info['platform']}, "
          f"C API {info['api_version'][0]}.{info['api_version'][1]}), "
          f"{torch.tpu.device_count()} device(s), torch {torch.__version__}")
    cfg = models.GPTConfig()
    print(f"GPT: vocab {cfg.vocab}, context {cfg.block}, width {cfg.n_embd}, {cfg.n_layer} layers, "
          f"{cfg.n_head} heads, tied head; AdamW, grad clipping, batch 8")
    diff = forward_check()

    cpu_first = models.train("gpt", "cpu", 1)[0]
    print(f"training {args.steps} steps on tpu:")
    losses, step_times, first_compiles = train(args.steps)
    warm = statistics.median(step_times[5:]) if len(step_times) > 6 else step_times[-1]
    m = torch_pjrt.metrics()
    print(f"first-step loss: tpu {losses[0]:.6f}, cpu {cpu_first:.6f} (|diff| {abs(losses[0] - cpu_first):.1e})")
    print(f"loss: {losses[0]:.4f} -> {statistics.mean(losses[-10:]):.4f} (mean of the last 10 steps)")
    print(f"first step (compiles included): {step_times[0] * 1e3:.0f} ms, {first_compiles} programs compiled")
    print(f"warm step (median of steps 6..{args.steps}): {warm * 1e3:.1f} ms ({1 / warm:.1f} steps/s)")
    print(f"programs compiled in total: {m['xla_compiles']} ({m['compile_seconds']:.1f} s compiling), "
          f"executions: {m['executions']}, CPU fallbacks: {m['cpu_fallbacks'] or 'none'}")
    if diff > 1e-4 or abs(losses[0] - cpu_first) > 1e-4:
        raise SystemExit("tpu results differ from CPU")


if __name__ == "__main__":
    main()
