"""Greedy `generate` of tiny Hugging Face causal LMs (tests/hf_families.py's
random-weight configs) on tpu against PyTorch CPU eager: per-token time and
the first call's time, per cache and mode, the tokens compared with CPU's.

Modes:
- cpu: PyTorch eager on CPU, the default (dynamic) cache;
- strict / fused: tpu strict eager, tpu fused eager (`torch_pjrt.fused()`),
  the dynamic cache;
- static: tpu, `cache_implementation="static"`: transformers compiles the
  decode step with torch.compile's default backend, which torch_pjrt sends to
  backend="tpu" (the first call includes that compile; with a warm persistent
  cache the XLA compiles are loaded, Dynamo's tracing is not).

Per token: median time between tokens of a warm call (a streamer's
timestamps), after one untimed call. "static 1st call": the first generate
of the static mode (its first repeat), with transformers' torch.compile of the
decode step in it (Dynamo is reset before each static run). "compiled graph
runs": torch_pjrt's compiled-graph calls in the timed call (one per decode step
and one for the prefill when the step runs compiled; 0 would mean eager).
Modes run one after another per family, --repeats times;
the per-token figure is the median over repeats.

    python benchmarks/hf_generate.py [--families GPT-2,Llama] [--tokens 32] [--repeats 2] [--markdown]
"""
import argparse
import os
import statistics
import sys
import time
import warnings

import torch

import torch_pjrt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import hf_families  # noqa: E402

MODES = ("cpu", "strict", "fused", "static")


class Stamps:
    """A generate streamer that notes when each new token arrives (the first
    put is the prompt)."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def run(fam, mode, tokens):
    model = fam.build().eval().to("cpu" if mode == "cpu" else "tpu")
    ids = hf_families._ids((1, 8), seed=5).to(next(model.parameters()).device)
    kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    if mode == "static":
        kw["cache_implementation"] = "static"
        # A new model is a new guard for Dynamo: without a reset, repeats and
        # families would add up to its recompile limit and run eagerly.
        torch._dynamo.reset()
    region = torch_pjrt.fused() if mode == "fused" else torch.no_grad()
    with region, torch.no_grad():
        start = time.perf_counter()
        out = model.generate(ids, **kw)
        out.cpu()
        first = time.perf_counter() - start
        stamps = Stamps()
        runs = torch_pjrt.metrics()["compiled_graph_runs"]
        model.generate(ids, streamer=stamps, **kw).cpu()
        runs = torch_pjrt.metrics()["compiled_graph_runs"] - runs
    gaps = [b - a for a, b in zip(stamps.times[1:], stamps.times[2:])]
    return {"first": first, "per_token": statistics.median(gaps), "tokens": out[0].cpu().tolist(),
            "compiled_runs": runs}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(n for n, f in hf_families.FAMILIES.items()
                                                       if f.generates and f.library == "transformers"))
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--markdown", action="store_true")
    a = parser.parse_args()
    warnings.simplefilter("ignore")
    import transformers

    rows = []
    for name in [n for n in a.families.split(",") if n]:
        fam = hf_families.FAMILIES[name]
        res = {m: [] for m in MODES}
        for _ in range(a.repeats):
            for mode in MODES:
                res[mode].append(run(fam, mode, a.tokens))
        per = {m: statistics.median(r["per_token"] for r in res[m]) for m in MODES}
        ref = res["cpu"][0]["tokens"]
        row = [name]
        row.append(f"{per['cpu'] * 1e3:.2f}")
        for m in MODES[1:]:
            same = all(r["tokens"] == ref for r in res[m])
            row += [f"{per[m] * 1e3:.2f}", f"{per['cpu'] / per[m]:.2f}x", "yes" if same else "NO"]
        row.append(f"{res['static'][0]['first']:.2f}")
        row.append(str(min(r["compiled_runs"] for r in res["static"])))
        rows.append(row)
    head = ["family", "cpu per token (ms)"]
    for m in MODES[1:]:
        head += [f"{m} per token (ms)", f"{m} vs cpu", f"{m}: cpu's tokens"]
    head += ["static 1st call (s)", "static: compiled graph runs in a warm call (fewest)"]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, plugin "
          f"{torch_pjrt.plugin_info()['name']}, {os.cpu_count()} CPU cores; {a.tokens} new tokens, batch 1, "
          f"prompt 8; per token: median gap of a warm call, median over {a.repeats} repeats")
    if a.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in [head] + rows:
            print("  ".join(c.rjust(10) for c in r))


if __name__ == "__main__":
    main()
