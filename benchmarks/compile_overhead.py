"""Host time of one training step call (issue 15's per-call overhead).

The GPT (or MLP/CNN/wide GPT) step of examples/models.py in three forms:
forward + loss and clip + optimizer step each under
torch.compile(backend="tpu") as in benchmarks/compile_bench.py, run strictly
("strict") or inside torch_pjrt.fused() ("fused"); and the eager step wrapped
in torch_pjrt.capture_step ("captured", replayed from its 4th call;
"captured-caller": the same with TORCH_PJRT_ASYNC_LAUNCH=0). Per warm
call, medians over --steps calls:

  host (launch)    wall time of the call until it returns, the device work
                   queued (strict) or recorded (fused) but not waited for;
  in graph runs    of which inside CompiledGraphFn.__call__ (signature,
                   argument list, the C++ run: packing, launch or record),
                   or, captured, inside the C++ replay;
  execute calls    time inside the plugin's PJRT_LoadedExecutable_Execute
                   (metrics()["execute_call_seconds"]: the launch itself):
                   part of the host time on the calling thread, not part of
                   it where the launch thread makes the call (the captured
                   replay and strict eager ops, docs/ARCHITECTURE.md
                   "Launch thread"; "captured-caller" turns that off);
  elsewhere        the rest: Dynamo's guards and frame entry, AOTAutograd's
                   runtime wrappers, the autograd engine, eager glue ops;
  step             wall time including the device sync (or the fused flush);
  back to back     host time of each call in blocks of 10 calls with no
                   sync or read between them (after the synced calls above),
                   median over the blocks' calls: how a loop that reads the
                   loss only now and then runs, and the host time a device
                   of its own (not the host's cores) would see.

Each timed call starts after a device sync (and --settle-ms of idle time, 0 by
default). On the CPU plugin the "device" is the host's own cores: right after
a sync its worker threads still spin, and after idle time the first call
runs cold (5 ms of idle made the captured GPT call slower, 834 vs 585 us), so
host times here carry the machine's noise either way.

    python benchmarks/compile_overhead.py [--model gpt] [--modes strict,fused,captured]
        [--steps 30] [--markdown]
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
_BLOCK = 10  # calls per back-to-back block
_original_call = graph_fn.CompiledGraphFn.__call__


def _timed_call(self, *args):
    start = time.perf_counter()
    try:
        return _original_call(self, *args)
    finally:
        _inside[0] += time.perf_counter() - start


_original_replay = torch_pjrt._state.C.capture_replay


def _timed_replay(*args):
    start = time.perf_counter()
    try:
        return _original_replay(*args)
    finally:
        _inside[0] += time.perf_counter() - start


MODES = {"strict": "compiled, strict (one program per graph)",
         "fused": "compiled, fused (one program)",
         "captured": "captured step (one program, replayed)",
         "captured-caller": "captured step, execute call on the calling thread"}


def measure(kind, mode, steps, warmup, settle):
    # "captured-caller": the same replay with the launch thread off
    # (TORCH_PJRT_ASYNC_LAUNCH=0), so the plugin's execute call is host time.
    launch_thread = torch_pjrt._state.C.async_launch_enabled()
    torch_pjrt._state.C.set_async_launch(launch_thread and mode != "captured-caller")
    try:
        return _measure(kind, mode, steps, warmup, settle)
    finally:
        torch_pjrt._state.C.set_async_launch(launch_thread)


def _measure(kind, mode, steps, warmup, settle):
    model, make_opt, batch_fn, loss_fn = models.build(kind)
    model.to("tpu").train()
    params = list(model.parameters())
    opt = make_opt(params)
    batches = [tuple(t.to("tpu") for t in batch_fn(i)) for i in range(warmup + steps)]
    if mode.startswith("captured"):
        whole_step = models.captured_step(model, opt, loss_fn, params)

        def step(i):
            return whole_step(*batches[i])
    else:
        step = models.step_fn(model, opt, loss_fn, batches, params, backend="tpu")
    fused = mode == "fused"

    host, inside, execute, total = [], [], [], []
    m0 = None
    for i in range(warmup + steps):
        if i == warmup:
            m0 = torch_pjrt.metrics()
        torch.tpu.synchronize()
        if settle:  # let XLA's worker threads go idle: they share this machine's cores with the host
            time.sleep(settle)
        _inside[0] = 0.0
        e0 = torch_pjrt.metrics()["execute_call_seconds"]
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
            execute.append(torch_pjrt.metrics()["execute_call_seconds"] - e0)
            total.append(done - start)
    m1 = torch_pjrt.metrics()
    n = steps
    # Back to back: blocks of calls with no sync or read between them (a loop
    # that reads the loss only now and then); each call's host time.
    back = []
    i = 0
    for _ in range(max(1, steps // _BLOCK)):
        torch.tpu.synchronize()
        for _ in range(_BLOCK):
            start = time.perf_counter()
            if fused:
                torch_pjrt._state.C.fused_enter()
            step(i % (warmup + steps))
            if fused:
                torch_pjrt._state.C.fused_leave()
            back.append(time.perf_counter() - start)
            i += 1
    torch.tpu.synchronize()
    return {"host": statistics.median(host), "fastest": min(host), "back": statistics.median(back),
            "inside": statistics.median(inside),
            "execute": statistics.median(execute),
            "elsewhere": statistics.median(h - s for h, s in zip(host, inside)), "step": statistics.median(total),
            "executions": (m1["executions"] - m0["executions"]) / n,
            "graph_runs": (m1["compiled_graph_runs"] - m0["compiled_graph_runs"]) / n,
            "replays": (m1["capture_replays"] - m0["capture_replays"]) / n}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt", choices=("mlp", "cnn", "gpt", "gpt-wide"))
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {','.join(MODES)}")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per mode (median of medians)")
    parser.add_argument("--settle-ms", type=float, default=0.0,
                        help="sleep after each sync before the timed call (CPU plugin: the device's threads "
                             "spin on the host's cores for a while after work; 0: none)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        parser.error(f"unknown mode(s) {bad}: choose from {', '.join(MODES)}")
    graph_fn.CompiledGraphFn.__call__ = _timed_call
    torch_pjrt._state.C.capture_replay = _timed_replay
    runs = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:
            runs[mode].append(measure(args.model, mode, args.steps, max(args.warmup, 4), args.settle_ms / 1e3))
    head = ["step", "host per call (us)", "fastest call (us)", "back to back, per call (us)",
            "in graph runs / replay (us)",
            "plugin execute calls (us)",
            "elsewhere (us)", "step with wait (ms)", "executions per step", "replays per step"]
    rows = []
    for mode in modes:
        r = {k: statistics.median(x[k] for x in runs[mode]) for k in runs[mode][0]}
        rows.append([MODES[mode], f"{r['host'] * 1e6:.0f}", f"{r['fastest'] * 1e6:.0f}", f"{r['back'] * 1e6:.0f}",
                     f"{r['inside'] * 1e6:.0f}", f"{r['execute'] * 1e6:.0f}",
                     f"{r['elsewhere'] * 1e6:.0f}", f"{r['step'] * 1e3:.2f}", f"{r['executions']:.1f}",
                     f"{r['replays']:.1f}"])
    print(f"{args.model} training step, {args.steps} warm calls (each after a sync and {args.settle_ms:g} ms idle), "
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
