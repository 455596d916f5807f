"""What the in-program value checks cost (TORCH_PJRT_CHECKS=on, the default,
against off) on the GPT training step of examples/models.py, eager and
torch.compile'd, in one run.

TORCH_PJRT_CHECKS is read once per process, so every measurement is its own
process; on and off alternate (ROUNDS times each) so that drift on a shared
machine hits both alike. Each process trains STEPS steps; the figure is the
median step time after the first WARMUP steps (first steps compile), and the
table shows the median over rounds.

    python benchmarks/checks_cost.py [--steps 60] [--rounds 3] [--markdown]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 10

CHILD = r"""
import json, os, statistics, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "examples"))
import torch, torch_pjrt, models
times, last = [], [time.perf_counter()]
def on_step(step, loss):
    loss.item()  # waits for the step (and reports any failed check)
    now = time.perf_counter()
    times.append(now - last[0])
    last[0] = now
backend = None if sys.argv[2] == "eager" else "tpu"
models.train("gpt", "tpu", int(sys.argv[3]), on_step=on_step, compile_backend=backend)
print("RESULT " + json.dumps({"warm": statistics.median(times[%d:]),
                              "failures": torch_pjrt.metrics()["device_check_failures"]}))
""" % WARMUP


def measure(mode, checks, steps):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TORCH_PJRT_CHECKS=checks)
    p = subprocess.run([sys.executable, "-c", CHILD, ROOT, mode, str(steps)], env=env, capture_output=True,
                       text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(p.stderr[-2000:])
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    print(f"GPT training step, {args.steps} steps per process, warm = median of steps {WARMUP + 1}..N, "
          f"median of {args.rounds} alternating rounds, {os.cpu_count()} CPU cores")
    rows = []
    for mode in ("eager", "compiled"):
        on, off = [], []
        for _ in range(args.rounds):
            on.append(measure(mode, "on", args.steps)["warm"])
            off.append(measure(mode, "off", args.steps)["warm"])
        t_on, t_off = statistics.median(on), statistics.median(off)
        rows.append((mode, t_off * 1e3, t_on * 1e3, (t_on / t_off - 1) * 100))
    head = ["step", "checks off (ms)", "checks on (ms)", "cost"]
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for mode, off, on, pct in rows:
            print(f"| {mode} | {off:.2f} | {on:.2f} | {pct:+.1f}% |")
    else:
        print("  ".join(f"{h:>16}" for h in head))
        for mode, off, on, pct in rows:
            print("  ".join(f"{c:>16}" for c in (mode, f"{off:.2f}", f"{on:.2f}", f"{pct:+.1f}%")))


if __name__ == "__main__":
    main()
