"""Cold start of fused eager with an empty persistent cache: a trace that
repeats gets a fused program compiled on a compile thread while its
sightings run op by op (TORCH_PJRT_FUSED_BACKGROUND_COMPILE=1, the default),
against compiled on the calling thread at its second sighting, which then
waits for XLA (=0, before session 52).

Each workload runs in a fresh process with an empty cache, the two settings
alternating --repeats times; figures are medians. Columns: the workload's
wall seconds (to a synchronize), the whole process's seconds (start to exit,
which waits for compiles still running), fused programs compiled before the
workload ended, sightings run op by op while their program compiled, and the
last fifth of the steps' median step time (what the loop reached).

- gpt N steps: fused-eager training of examples/models.py's GPT, N steps,
  each reading its loss;
- llama N tokens: examples/tiny_llama.py's greedy generation of N tokens.

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

SETTINGS = {"on a compile thread (default)": "1", "on the caller": "0"}

WORKLOADS = {
    f"gpt {n} steps": f"""
import models
def run(stamp):
    with torch_pjrt.fused():
        models.train("gpt", "tpu", {n}, on_step=lambda s, loss: (loss.item(), stamp()))
""" for n in (5, 20, 100)
}
WORKLOADS.update({
    f"llama {n} tokens": f"""
import tiny_llama
model = tiny_llama.build().to("tpu")
prompt = tiny_llama.prompt()
def run(stamp):
    with torch_pjrt.fused():
        tiny_llama.generate(model, prompt, {n}, on_token=lambda i: stamp())
""" for n in (20, 100)
})

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
                  "last": statistics.median(steps[-max(1, len(steps) // 5):])}}), flush=True)
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
    for name, body in WORKLOADS.items():
        runs = {s: [] for s in SETTINGS}
        for _ in range(args.repeats):
            for setting, value in SETTINGS.items():
                runs[setting].append(run_child(body, value))
        for setting, rs in runs.items():
            med = {k: statistics.median(r[k] for r in rs) for k in ("wall", "process", "fused", "waiting", "last")}
            rows.append([name, setting, med["wall"], med["process"], int(med["fused"]), int(med["waiting"]),
                         med["last"] * 1e3])
    bench.print_table(["workload", "fused programs compile", "workload (s)", "process (s)", "fused programs",
                       "runs while compiling", "last steps (ms)"], rows,
                      ["", "", ".2f", ".2f", "", "", ".2f"], args.markdown)


if __name__ == "__main__":
    main()
