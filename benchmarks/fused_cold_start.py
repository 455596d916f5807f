"""Cold start of fused eager with an empty persistent cache, by where a
trace's fused program compiles (TORCH_PJRT_FUSED_BACKGROUND_COMPILE):
- auto (the default): a trace that earned its compile by rent or buy (back
  only after many others, as each token's trace of Hugging Face's generate
  with a growing cache) compiles on a compile thread while it runs op by op;
  one in a tight loop compiles on the caller at its second sighting;
- all: every fused program on a compile thread (the loop runs op by op
  until its program is there);
- off: every fused program on the caller (before session 52).

Each workload runs in a fresh process with an empty cache, the settings
alternating --repeats times; figures are medians. Columns: the workload's
wall seconds (to a synchronize), the whole process's seconds (start to exit,
which waits for compiles still running), fused programs compiled before the
workload ended, sightings run op by op while their program compiled, the
slowest step after the first (the first compiles the op programs; a stall
for a fused compile shows here) and the median of the last fifth of the
steps (the speed the loop reached).

- gpt N steps: fused-eager training of examples/models.py's GPT, N steps,
  each reading its loss;
- llama 100 tokens: examples/tiny_llama.py's greedy generation (a doubling
  KV cache: a tight loop per capacity);
- 9-trace cycle: nine traces of growing shapes in turn, each read on the
  host (as each token's trace of Hugging Face's generate with a growing
  cache comes back only in the next call); a step is a round of nine. They
  run op by op until that has cost about their compiles (rent or buy); the
  slowest round shows the compiles that then happen on the caller.

    python benchmarks/fused_cold_start.py [--repeats 3] [--markdown]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench  # noqa: E402

SETTINGS = ("auto", "all", "off")

WORKLOADS = {
    f"gpt {n} steps": f"""
import models
def run(stamp):
    with torch_pjrt.fused():
        models.train("gpt", "tpu", {n}, on_step=lambda s, loss: (loss.item(), stamp()))
""" for n in (5, 100)
}
WORKLOADS["llama 100 tokens"] = """
import tiny_llama
model = tiny_llama.build().to("tpu")
prompt = tiny_llama.prompt()
def run(stamp):
    with torch_pjrt.fused():
        tiny_llama.generate(model, prompt, 100, on_token=lambda i: stamp())
"""
WORKLOADS["9-trace cycle, 3000 rounds"] = """
x = torch.linspace(-2, 2, 16, device="tpu")
def grown(n):
    y = torch.cat((x, x[:n] * 2.0)).sin() + 1.0
    return (y * y).sum().item()
def run(stamp):
    with torch_pjrt.fused():
        grown(12); grown(12)  # a tight loop first (a measured compile cost)
        for _ in range(3000):
            for n in range(2, 11):
                grown(n)
            stamp()
"""

CHILD = """
import json, os, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "examples"))
import torch, torch_pjrt
{body}
stamps = []
m0 = torch_pjrt.metrics()
t0 = time.perf_counter()
run(lambda: stamps.append(time.perf_counter()))
torch.tpu.synchronize()
wall = time.perf_counter() - t0
m1 = torch_pjrt.metrics()
steps = [b - a for a, b in zip([t0] + stamps, stamps)]
print(json.dumps({{"wall": wall, "fused": m1["fused_programs_compiled"] - m0["fused_programs_compiled"],
                  "waiting": m1["fused_runs_while_compiling"] - m0["fused_runs_while_compiling"],
                  "slowest": max(steps[1:] or steps), "last": statistics.median(steps[-max(1, len(steps) // 5):])}}),
      flush=True)
""".replace("import json, os, sys, time", "import json, os, statistics, sys, time")


def run_child(body, background):
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache, TORCH_PJRT_FUSED_BACKGROUND_COMPILE=background,
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", CHILD.format(body=body), ROOT], env=env,
                           capture_output=True, text=True, timeout=900)
        process = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    return dict(json.loads(p.stdout.strip().splitlines()[-1]), process=process)


def main():
    args = bench.parse_args(__doc__, repeats=3)
    rows = []
    keys = ("wall", "process", "fused", "waiting", "slowest", "last")
    for name, body in WORKLOADS.items():
        runs = {s: [] for s in SETTINGS}
        for _ in range(args.repeats):
            for setting in SETTINGS:
                runs[setting].append(run_child(body, setting))
        for setting, rs in runs.items():
            med = {k: statistics.median(r[k] for r in rs) for k in keys}
            rows.append([name, setting, med["wall"], med["process"], int(med["fused"]), int(med["waiting"]),
                         med["slowest"] * 1e3, med["last"] * 1e3])
    bench.print_table(["workload", "setting", "workload (s)", "process (s)", "fused programs",
                       "runs while compiling", "slowest step after the first (ms)", "last steps (ms)"], rows,
                      ["", "", ".2f", ".2f", "", "", ".0f", ".2f"], args.markdown)


if __name__ == "__main__":
    main()
