"""Cold start with an empty persistent cache: what XLA's compiles cost a new
process on XLA's CPU plugin, by the emitters that compile its programs and by
where eager programs compile:
- default: programs of at most 64 operations with the LLVM IR emitters
  (`xla_cpu_use_fusion_emitters=false`, a per-compile option), larger ones
  with XLA's default MLIR fusion emitters; eager programs on compile threads
  (TORCH_PJRT_COMPILE_THREADS, default the CPU count);
- the same, compiled on the calling thread (TORCH_PJRT_COMPILE_THREADS=0);
- LLVM IR emitters for all (`XLA_FLAGS=--xla_cpu_use_fusion_emitters=false`), on the caller;
- MLIR fusion emitters for all, on the caller: XLA's default, and torch_pjrt
  before session 51.

Each workload runs in a fresh process with an empty cache, the settings
alternating --repeats times; figures are medians. Columns: wall seconds of
the workload, XLA compiles, and the seconds they took (metrics(); compiles on
threads overlap, so their seconds can exceed the wall time).

- elementwise: `x + 1` on 40 new shapes, each read back (40 one-op programs,
  one at a time);
- gpt eager: the first 3 strict-eager training steps of examples/models.py's GPT;
- gpt captured: the first 5 steps of the same GPT as one captured step
  (torch_pjrt.capture_step: its op programs, then one whole-step program);
- hf generate: tests/hf_families.py's tiny Llama, greedy `generate` of 16
  tokens with transformers' default dynamic cache in strict eager (the cache
  grows, so each token's attention ops are new programs).

    python benchmarks/cold_start.py [--repeats 2] [--markdown]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench  # noqa: E402

CALLER = {"TORCH_PJRT_COMPILE_THREADS": "0"}
SETTINGS = {
    "default (by size, compile threads)": {},
    "by size, on the caller": CALLER,
    "LLVM IR for all, on the caller": dict(CALLER, XLA_FLAGS="--xla_cpu_use_fusion_emitters=false"),
    "MLIR fusion for all, on the caller": dict(CALLER, XLA_FLAGS="--xla_cpu_use_fusion_emitters=true"),
}

WORKLOADS = {
    "elementwise": """
xs = [torch.randn(3, n) for n in range(1, 41)]
def run():
    for x in xs:
        (x.to("tpu") + 1).cpu()
""",
    "gpt eager": """
import models
def run():
    models.train("gpt", "tpu", 3)
""",
    "gpt captured": """
import models
model, make_opt, batch_fn, loss_fn = models.build("gpt", 0)
model = model.to("tpu")
opt = make_opt(model.parameters())
step = models.captured_step(model, opt, loss_fn, list(model.parameters()))
batches = [tuple(t.to("tpu") for t in batch_fn(i)) for i in range(5)]
def run():
    for x, y in batches:
        step(x, y).item()
""",
    "hf generate": """
import warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.join(ROOT, "tests"))
import hf_families
model = hf_families.FAMILIES["Llama"].build().eval().to("tpu")
ids = hf_families._ids((1, 5), seed=5).to("tpu")
def run():
    model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
""",
}

CHILD = """
import json, os, sys, time
ROOT = sys.argv[1]
sys.path.insert(0, os.path.join(ROOT, "examples"))
import torch, torch_pjrt
{body}
m0 = torch_pjrt.metrics()
t0 = time.perf_counter()
run()
torch.tpu.synchronize()
wall = time.perf_counter() - t0
m1 = torch_pjrt.metrics()
print(json.dumps({{"wall": wall, "compiles": m1["xla_compiles"] - m0["xla_compiles"],
                  "compile_s": m1["compile_seconds"] - m0["compile_seconds"]}}))
"""


def run_child(body, setting):
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TORCH_PJRT_COMPILE_THREADS")}
        env.update(TORCH_PJRT_CACHE_DIR=cache, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   **setting)
        p = subprocess.run([sys.executable, "-c", CHILD.format(body=body), ROOT], env=env,
                           capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    args = bench.parse_args(__doc__, repeats=2)
    rows = []
    for name, body in WORKLOADS.items():
        if name == "hf generate":
            try:
                import transformers  # noqa: F401
            except ImportError:
                continue
        runs = {s: [] for s in SETTINGS}
        for _ in range(args.repeats):
            for name_, setting in SETTINGS.items():
                runs[name_].append(run_child(body, setting))
        for setting, rs in runs.items():
            med = {k: statistics.median(r[k] for r in rs) for k in ("wall", "compiles", "compile_s")}
            ms_per = med["compile_s"] / max(med["compiles"], 1) * 1e3
            rows.append([name, setting, med["wall"], int(med["compiles"]), med["compile_s"], ms_per])
    bench.print_table(["workload", "setting", "wall (s)", "XLA compiles", "compile (s)",
                       "ms per compile"], rows, ["", "", ".2f", "", ".2f", ".1f"], args.markdown)


if __name__ == "__main__":
    main()
