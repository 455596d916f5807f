"""Fused eager against strict eager and PyTorch eager on CPU, in one run.

Training (examples/models.py, the step ends with a host read of the loss):
first step (compiles included), warm step = median of steps 6..N, programs
compiled. Generation (examples/tiny_llama.py, greedy with a KV cache, a host
read per token): warm per-token time (a second generation, everything
compiled; also with each token's step replayed by torch_pjrt.capture_step,
"captured"), and in fresh processes with no persistent cache the programs
compiled and compile seconds after 10, 25, 50 and 100 tokens, for the
doubling cache and for a cache that concatenates per token. Then strict
eager's per-op launch cost against a PyTorch CPU kernel call, for a few kinds
of op, and the runtime's execute call alone for the same add program (the
floor under any launched op).

    python benchmarks/fused_eager.py [--steps N] [--tokens N] [--markdown] [--launch-only]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import torch_pjrt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import models  # noqa: E402
import tiny_llama  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

# The PyTorch eager device the "cpu" rows run on (--baseline): cpu, or cuda on
# a GPU machine (scripts/gpu_check.sh, with the CUDA plugin under "tpu").
BASELINE = "cpu"


class Mode:
    """cpu / strict (tpu) / fused (tpu) as a context. "fused-whole" is fused
    eager with pipelined flushes off (each trace runs whole when a value is
    needed), for comparison in the same run."""

    def __init__(self, name):
        self.name = name
        self.device = BASELINE if name == "cpu" else "tpu"
        self.region = torch_pjrt.fused(pipeline=name == "fused") if name.startswith("fused") else None

    def __enter__(self):
        if self.region:
            self.region.__enter__()

    def __exit__(self, *exc):
        if self.region:
            self.region.__exit__(*exc)


MODES = ("cpu", "strict", "fused-whole", "fused")
# Generation also with each token's step replayed (torch_pjrt.capture_step).
GEN_MODES = ("cpu", "strict", "fused", "captured")


def train_times(kind, mode, steps, memory=False):
    """Step times (each step ends with loss.item(), as training loops do);
    with `memory`, also a synchronize and the device memory after each step
    (which keeps a step's work from overlapping the next: not timed then)."""
    times, last = [], [time.perf_counter()]
    on_tpu = mode != "cpu"
    peaks, base = [], [0]  # device memory a step adds at its peak over what it started with

    def on_step(step, loss):
        loss.item()
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now
        if on_tpu and memory:
            torch.tpu.synchronize()
            peaks.append(torch.tpu.max_memory_allocated() - base[0])
            base[0] = torch.tpu.memory_allocated()
            torch.tpu.reset_peak_memory_stats()

    m0 = torch_pjrt.metrics()
    if on_tpu:
        torch.tpu.synchronize()
        base[0] = torch.tpu.memory_allocated()
        torch.tpu.reset_peak_memory_stats()
    with Mode(mode):
        models.train(kind, Mode(mode).device, steps, on_step=on_step)
    m1 = torch_pjrt.metrics()
    return {"first": times[0], "warm": statistics.median(times[5:]),
            "step_peak": statistics.median(peaks[5:]) if on_tpu and memory else 0,
            "donated": m1["fused_donated_bytes"] - m0["fused_donated_bytes"],
            "compiles": m1["xla_compiles"] - m0["xla_compiles"],
            "fused_compiles": m1["fused_programs_compiled"] - m0["fused_programs_compiled"],
            "flushes": m1["fused_flushes"] - m0["fused_flushes"],
            "ops": m1["fused_ops_recorded"] - m0["fused_ops_recorded"]}


def token_times(mode, tokens, cache):
    model = tiny_llama.build().to(Mode(mode).device)
    prompt = tiny_llama.prompt()
    out = {}
    capture = mode == "captured"
    with Mode(mode):
        ref = tiny_llama.generate(model, prompt, tokens, cache=cache, capture=capture)  # compiles everything
        stamps = []
        tiny_llama.generate(model, prompt, tokens, cache=cache, on_token=lambda i: stamps.append(time.perf_counter()),
                            capture=capture)
    out["per_token"] = statistics.median(b - a for a, b in zip(stamps, stamps[1:]))
    out["tokens"] = ref[0, -tokens:].cpu().tolist()
    return out


def compile_growth(mode, tokens, cache, compile_policy="auto"):
    """Programs compiled and compile seconds after 10/25/50/100 tokens, in a
    fresh process; then two more generate calls of the same length (a server's
    next requests): seconds, programs compiled, fused programs compiled each."""
    code = f"""
import contextlib, json, sys, time
sys.path.insert(0, {os.path.join(ROOT, 'examples')!r})
import torch, torch_pjrt, tiny_llama
marks = {{10, 25, 50, {tokens}}}
rows = {{}}
def on_token(i):
    if i + 1 in marks:
        m = torch_pjrt.metrics()
        rows[i + 1] = [m["xla_compiles"], m["compile_seconds"], m["fused_programs_compiled"]]
model = tiny_llama.build().to("tpu")
later = []
with torch_pjrt.fused() if {mode == 'fused'} else contextlib.nullcontext():
    tiny_llama.generate(model, tiny_llama.prompt(), {tokens}, cache={cache!r}, on_token=on_token)
    for call in range(2):
        m0, t0 = torch_pjrt.metrics(), time.perf_counter()
        tiny_llama.generate(model, tiny_llama.prompt(), {tokens}, cache={cache!r}).cpu()
        m1 = torch_pjrt.metrics()
        later.append([time.perf_counter() - t0, m1["xla_compiles"] - m0["xla_compiles"],
                      m1["fused_programs_compiled"] - m0["fused_programs_compiled"]])
print(json.dumps({{"rows": rows, "later": later}}))
"""
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR="", TORCH_PJRT_FUSED_COMPILE=compile_policy,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return {int(k): v for k, v in out["rows"].items()}, out["later"]


def table(head, rows, markdown):
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(str(c) for c in r) + " |")
    else:
        print("  ".join(f"{h:>14}" for h in head))
        for r in rows:
            print("  ".join(f"{str(c):>14}" for c in r))
    print()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--skip-growth", action="store_true", help="no fresh-process compile counts")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per mode (median of medians)")
    parser.add_argument("--launch-only", action="store_true", help="only the per-op launch table")
    parser.add_argument("--baseline", default="cpu", choices=("cpu", "cuda"),
                        help="the PyTorch eager device compared with (the rows and columns named cpu)")
    args = parser.parse_args()
    global BASELINE
    BASELINE = args.baseline
    b = BASELINE
    info = torch_pjrt.plugin_info()
    print(f"plugin '{info['name']}' ({info['platform']}), baseline PyTorch eager on {b}, "
          f"torch {torch.__version__}, {os.cpu_count()} CPU cores; "
          f"training: {args.steps} steps, warm = median of steps 6..N; generation: {args.tokens} tokens; "
          f"{args.repeats} alternating runs per mode, median of their medians\n")
    if args.launch_only:
        launch_table(args.repeats, args.markdown)
        return

    rows, mem = [], []
    for kind in ("mlp", "cnn", "gpt"):
        # Modes alternate, `repeats` times; each warm figure is the median over
        # repeats of each run's median (this shared 2-core machine is noisy).
        runs = {mode: [] for mode in MODES}
        for _ in range(args.repeats):
            for mode in MODES:
                runs[mode].append(train_times(kind, mode, args.steps))
        r = {mode: dict(runs[mode][0], warm=statistics.median(x["warm"] for x in runs[mode])) for mode in MODES}
        if kind == "mlp" and args.repeats > 1 and BASELINE == "cpu":
            # The first cpu run came before any tpu work in this process; the
            # others after it. A process whose tpu work slowed PyTorch's CPU
            # ops (a second OpenMP team did, 2.6x) makes no clean baseline.
            before, after = runs["cpu"][0]["warm"], statistics.median(x["warm"] for x in runs["cpu"][1:])
            if after > 1.3 * before:
                print(f"warning: PyTorch CPU's MLP step took {after / before:.2f}x as long after tpu work in this "
                      "process as before it: the cpu columns are not a clean baseline", file=sys.stderr)
        c, s, w, f = (r[m]["warm"] for m in MODES)
        rows.append([kind, f"{c * 1e3:.2f}", f"{s * 1e3:.2f}", f"{w * 1e3:.2f}", f"{f * 1e3:.2f}", f"{s / f:.2f}x",
                     f"{c / f:.2f}x", f"{r['strict']['first'] * 1e3:.0f}", f"{r['fused']['first'] * 1e3:.0f}",
                     r["fused"]["fused_compiles"],
                     f"{r['fused']['ops'] / max(r['fused']['flushes'], 1):.0f}"])
        peak = {mode: train_times(kind, mode, args.steps, memory=True) for mode in ("strict", "fused-whole", "fused")}
        params = sum(q.numel() * q.element_size() for q in models.build(kind)[0].parameters())
        mem.append([kind, f"{params / 2**10:.0f}"] +
                   [f"{peak[m]['step_peak'] / 2**10:.0f}" for m in ("strict", "fused-whole", "fused")] +
                   [f"{peak['fused']['donated'] / max(args.steps - 2, 1) / 2**10:.0f}"])
    table(["model", f"{b} step (ms)", "strict step (ms)", "fused, whole trace (ms)", "fused, pipelined (ms)",
           "fused vs strict", f"fused vs {b}", "strict 1st (ms)", "fused 1st (ms)", "fused programs",
           "ops/flush"], rows, args.markdown)
    print("Device memory a warm training step adds at its peak (median of steps 6..N, a synchronize after each "
          "step) over what it started with; fused donates the parameters and optimizer state it overwrites, "
          "and a pipelined step keeps what crosses its cut (saved activations) as buffers:")
    table(["model", "parameters (KiB)", "strict step peak (KiB)", "fused whole-trace peak (KiB)",
           "fused pipelined peak (KiB)", "fused donated per step (KiB)"], mem, args.markdown)

    rows = []
    ref = None
    gen = {}
    samples = {mode: [] for mode in GEN_MODES}
    for _ in range(args.repeats):
        for mode in GEN_MODES:
            g = token_times(mode, args.tokens, "double")
            samples[mode].append(g["per_token"])
            gen[mode] = g
            ref = ref or g["tokens"]
    for mode in GEN_MODES:
        gen[mode]["per_token"] = statistics.median(samples[mode])
    c = gen["cpu"]["per_token"]
    for mode in GEN_MODES:
        t = gen[mode]["per_token"]
        rows.append([b if mode == "cpu" else mode, f"{t * 1e3:.3f}", f"{c / t:.2f}x",
                     "yes" if gen[mode]["tokens"] == ref else "NO"])
    print(f"Greedy generation, tiny Llama (examples/tiny_llama.py), doubling KV cache, warm per token:")
    table(["mode", "per token (ms)", f"speed vs {b}", f"same tokens as {b}"], rows, args.markdown)

    if not args.skip_growth:
        rows, later = [], []
        for cache in ("double", "cat"):
            for mode in ("strict", "fused"):
                g, again = compile_growth(mode, args.tokens, cache)
                rows.append([cache, mode] + [f"{g[n][0]} / {g[n][1]:.1f} s / {g[n][2]}" for n in sorted(g)])
                later.append([cache, mode] + [f"{s:.2f} s / {c} / {f}" for s, c, f in again])
        _, again = compile_growth("fused", args.tokens, "cat", compile_policy="second")
        later.append(["cat", "fused, TORCH_PJRT_FUSED_COMPILE=second"] + [f"{s:.2f} s / {c} / {f}" for s, c, f in again])
        marks = sorted(g)
        print("Programs compiled / compile seconds / of which fused, fresh process, no persistent cache:")
        table(["KV cache", "mode"] + [f"after {n} tokens" for n in marks], rows, args.markdown)
        print(f"The same process's next two generate calls of {args.tokens} tokens: seconds / programs compiled / "
              "of which fused (a trace back only after many others runs op by op until that has cost about "
              "its compile):")
        table(["KV cache", "mode", "2nd call", "3rd call"], later, args.markdown)

    m0 = torch_pjrt.metrics()
    train_times("gpt", "fused", args.steps)
    m1 = torch_pjrt.metrics()
    reasons = {k: v - m0["fused_flushes_by_reason"].get(k, 0) for k, v in m1["fused_flushes_by_reason"].items()}
    print("metrics() of one fused GPT training run:",
          {"flushes by reason": {k: v for k, v in reasons.items() if v},
           "ops per flush": round((m1["fused_ops_recorded"] - m0["fused_ops_recorded"]) /
                                  max(1, m1["fused_flushes"] - m0["fused_flushes"]), 1),
           "fused programs compiled": m1["fused_programs_compiled"] - m0["fused_programs_compiled"],
           "pipeline cuts learned": m1["fused_pipeline_cuts_learned"] - m0["fused_pipeline_cuts_learned"],
           "fused cache hits": m1["fused_cache_hits"] - m0["fused_cache_hits"],
           "op-by-op runs": m1["fused_op_by_op_runs"] - m0["fused_op_by_op_runs"]})
    print()
    launch_table(args.repeats, args.markdown)


ADD_PROGRAM = """module @floor {
  func.func public @main(%a: tensor<16xf32>, %b: tensor<16xf32>) -> (tensor<16xf32>) {
    %s = "stablehlo.add"(%a, %b) : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
    "func.return"(%s) : (tensor<16xf32>) -> ()
  }
}
"""


def per_call(fn, device, n=2000):
    """Seconds per call of fn() launched n times in a loop, then one wait."""
    for _ in range(50):
        fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return (time.perf_counter() - start) / n


def sync(device):
    if device == "tpu":
        torch.tpu.synchronize()
    elif device == "cuda":
        torch.cuda.synchronize()


def launch_table(repeats, markdown):
    """Strict eager's per-op launch against a PyTorch CPU kernel call on 16
    floats, per kind of op (alternating devices, median of 5 x repeats): with
    the plugin's execute call on the launch thread (the default) and on the
    calling thread (TORCH_PJRT_ASYNC_LAUNCH=0), alternating in this process;
    and the runtime's execute call alone for the same add program: the floor
    under an op launched on the calling thread."""
    def ops(device):
        x, y = torch.ones(16, device=device), torch.ones(16, device=device)
        base = torch.ones(64, device=device)
        return {"add(x, y)": lambda: torch.add(x, y), "x + 2.5 (Python scalar)": lambda: x + 2.5,
                "relu(x)": lambda: torch.relu(x), "base[8:24] * 2 (view at an offset)": lambda: base[8:24] * 2}
    C = torch_pjrt._state.C
    launch_thread = C.async_launch_enabled()
    cpu_ops, tpu_ops = ops(BASELINE), ops("tpu")
    samples = {name: ([], [], []) for name in cpu_ops}
    floor = []
    xt, yt = torch.ones(16, device="tpu"), torch.ones(16, device="tpu")
    try:
        for _ in range(5 * repeats):
            for name in cpu_ops:
                samples[name][0].append(per_call(cpu_ops[name], BASELINE))
                C.set_async_launch(True)
                samples[name][1].append(per_call(tpu_ops[name], "tpu"))
                C.set_async_launch(False)
                samples[name][2].append(per_call(tpu_ops[name], "tpu"))
            floor.append(C.execute_floor(ADD_PROGRAM, [xt, yt], 2000))
    finally:
        C.set_async_launch(launch_thread)
    rows = []
    for name, (c, t, s) in samples.items():
        c, t, s = statistics.median(c), statistics.median(t), statistics.median(s)
        rows.append([name, f"{c * 1e6:.2f}", f"{t * 1e6:.2f}", f"{t / c:.2f}x", f"{s * 1e6:.2f}", f"{s / c:.2f}x"])
    c_add, f = statistics.median(samples["add(x, y)"][0]), statistics.median(floor)
    rows.append(["add program, runtime execute call alone", "", "", "", f"{f * 1e6:.2f}", f"{f / c_add:.2f}x"])
    b = BASELINE
    table(["op on 16 floats", f"{b} (us)", "tpu strict (us)", f"ratio to {b}", "tpu strict, execute on the calling "
           f"thread (us)", f"ratio to {b}"], rows, markdown)


if __name__ == "__main__":
    main()
