"""Host time of one compiled training step call (issue 15's per-call overhead).

The GPT (or MLP/CNN) step of examples/models.py with forward + loss and clip +
optimizer step each under torch.compile(backend="tpu"), as in
benchmarks/compile_bench.py. Per warm call, medians over --steps calls:

  host (launch)    wall time of the call until it returns, the device work
                   queued (strict) or recorded (fused) but not waited for;
  in graph runs    of which inside CompiledGraphFn.__call__ (signature,
                   argument list, the C++ run: packing, launch or record);
  elsewhere        the rest: Dynamo's guards and frame entry, AOTAutograd's
                   runtime wrappers, the autograd engine, eager glue ops;
  step             wall time including the device sync (or the fused flush).

    python benchmarks/compile_overhead.py [--model gpt] [--steps 30] [--markdown]
"""
import argparse
import os
import statistics
import sys
import time

import torch

import torch_pjrt
from torch_pjrt._compile import graph_fn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import models  # noqa: E402

_inside = [0.0]
_original_call = graph_fn.CompiledGraphFn.__call__


def _timed_call(self, *args):
    start = time.perf_counter()
    try:
        return _original_call(self, *args)
    finally:
        _inside[0] += time.perf_counter() - start


def measure(kind, fused, steps, warmup):
    model, make_opt, batch_fn, loss_fn = models.build(kind)
    model.to("tpu").train()
    params = list(model.parameters())
    opt = make_opt(params)
    batches = [tuple(t.to("tpu") for t in batch_fn(i)) for i in range(warmup + steps)]
    step = models.step_fn(model, opt, loss_fn, batches, params, backend="tpu")

    host, inside, total = [], [], []
    m0 = None
    for i in range(warmup + steps):
        if i == warmup:
            m0 = torch_pjrt.metrics()
        torch.tpu.synchronize()
        _inside[0] = 0.0
        start = time.perf_counter()
        if fused:
            torch_pjrt._state.C.fused_enter()
        loss = step(i)
        launched = time.perf_counter()
        if fused:
            torch_pjrt._state.C.fused_leave()  # the trace runs here
        loss.item()
        done = time.perf_counter()
        if i >= warmup:
            host.append(launched - start)
            inside.append(_inside[0])
            total.append(done - start)
    m1 = torch_pjrt.metrics()
    n = steps
    return {"host": statistics.median(host), "inside": statistics.median(inside),
            "elsewhere": statistics.median(h - s for h, s in zip(host, inside)), "step": statistics.median(total),
            "executions": (m1["executions"] - m0["executions"]) / n,
            "graph_runs": (m1["compiled_graph_runs"] - m0["compiled_graph_runs"]) / n}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt", choices=("mlp", "cnn", "gpt"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per mode (median of medians)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    graph_fn.CompiledGraphFn.__call__ = _timed_call
    runs = {False: [], True: []}
    for _ in range(args.repeats):
        for fused in (False, True):
            runs[fused].append(measure(args.model, fused, args.steps, args.warmup))
    head = ["compiled step", "host per call (us)", "in graph runs (us)", "elsewhere (us)", "step with wait (ms)",
            "executions per step", "graph runs per step"]
    rows = []
    for fused in (False, True):
        r = {k: statistics.median(x[k] for x in runs[fused]) for k in runs[fused][0]}
        rows.append(["fused (one program)" if fused else "strict (one program per graph)", f"{r['host'] * 1e6:.0f}",
                     f"{r['inside'] * 1e6:.0f}", f"{r['elsewhere'] * 1e6:.0f}", f"{r['step'] * 1e3:.2f}",
                     f"{r['executions']:.1f}", f"{r['graph_runs']:.1f}"])
    print(f"{args.model} training step, torch.compile(backend='tpu'), {args.steps} warm calls, "
          f"median of {args.repeats} alternating runs' medians, plugin {torch_pjrt.plugin_info()['name']}")
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(h), 12) for h in head]
        print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
        for r in rows:
            print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
