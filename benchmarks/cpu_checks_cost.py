"""What asking PyTorch's CPU kernels for their checks costs (csrc/eager/cpu_check.*:
on, the default, against TORCH_PJRT_CPU_CHECKS=off) where it runs: when an
eager op's plan is built, i.e. the first steps of a process.

Each measurement is a fresh process training examples/models.py's model for
a few strict-eager steps: the first step (every plan built) and the median
of the rest (all cache hits), once with an empty persistent cache (XLA
compiles every program) and once with that cache warm (programs loaded from
disk, where the probe is the largest share of a miss). Settings alternate,
`--repeats` processes each; medians.

    python benchmarks/cpu_checks_cost.py [--models mlp cnn gpt] [--repeats 3] [--markdown]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, statistics, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "examples"))
import torch, torch_pjrt, models
kind, steps = sys.argv[2], int(sys.argv[3])
times = []
def on_step(step, loss):
    times.append(time.perf_counter())
t0 = time.perf_counter()
models.train(kind, "tpu", steps, on_step=on_step)
first = times[0] - t0
rest = [b - a for a, b in zip(times, times[1:])]
m = torch_pjrt.metrics()
print("RESULT " + json.dumps({"first": first, "steady": statistics.median(rest),
                              "plans": m["executable_cache_misses"]}))
"""


def run(kind, steps, setting, cache_dir):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TORCH_PJRT_CPU_CHECKS=setting,
               TORCH_PJRT_CACHE_DIR=cache_dir)
    p = subprocess.run([sys.executable, "-c", CHILD, ROOT, kind, str(steps)], env=env, capture_output=True,
                       text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(p.stderr[-2000:])
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "gpt"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    print(f"strict eager, {args.steps} training steps per process, {args.repeats} processes per cell, "
          f"settings alternating; medians; {os.cpu_count()} CPU cores")
    rows = []
    for kind in args.models:
        cells = {}
        for cache in ("cold", "warm"):
            got = {"on": [], "off": []}
            for r in range(args.repeats):
                for setting in (("on", "off") if r % 2 == 0 else ("off", "on")):
                    with tempfile.TemporaryDirectory() as d:
                        if cache == "warm":
                            run(kind, 2, setting, d)  # fills the persistent cache
                        got[setting].append(run(kind, args.steps, setting, d))
            cells[cache] = got
        med = lambda xs, k: statistics.median(x[k] for x in xs) * 1e3  # noqa: E731
        plans = cells["cold"]["on"][0]["plans"]
        rows.append((kind, plans,
                     med(cells["cold"]["off"], "first"), med(cells["cold"]["on"], "first"),
                     med(cells["warm"]["off"], "first"), med(cells["warm"]["on"], "first"),
                     med(cells["cold"]["off"], "steady"), med(cells["cold"]["on"], "steady")))
    head = ["model", "plans built", "1st step, cold cache, off (ms)", "on (ms)", "1st step, warm cache, off (ms)",
            "on (ms)", "later steps, off (ms)", "on (ms)"]
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in rows:
            print(f"| {r[0]} | {r[1]} | " + " | ".join(f"{v:.1f}" if i < 4 else f"{v:.2f}"
                                                     for i, v in enumerate(r[2:])) + " |")
    else:
        for r in rows:
            print(f"{r[0]:>5} plans {r[1]:4d}  cold first off {r[2]:.1f} on {r[3]:.1f} ms  "
                  f"warm first off {r[4]:.1f} on {r[5]:.1f} ms  steady off {r[6]:.2f} on {r[7]:.2f} ms")


if __name__ == "__main__":
    main()
