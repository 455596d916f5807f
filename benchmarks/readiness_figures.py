"""The figures in docs/tpu_readiness.md: the shipped GPT (training, AdamW)
and CNN (inference) compiled by libtpu for v5e, v6e and v5p, one chip and
four, with the largest batch that fits one v5e chip. Prints markdown tables; --json keeps
every figure. Memory is XLA's compiled statistics; times are roofline
ESTIMATES from published peaks, not measurements.

    python benchmarks/readiness_figures.py [--tolerance 0.05] [--json out.json]
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import torch_pjrt  # noqa: E402,F401
from torch_pjrt.readiness import cli, available, install_hint  # noqa: E402
import workloads  # noqa: E402

TOPOLOGIES = ["v5e:2x2", "v6e:2x2", "v5p:2x2x1"]


def md_table(rows):
    out = ["| topology | chips | batch | fits | peak / chip memory | GFLOP / step | intensity | step (estimate) "
           "| items/s (estimate) | largest batch | compile s |", "|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['topology']} | {r['chips']} | {r['batch_size']} | error: {r['error']} |||||||")
            continue
        inten = r["step_flops"] / r["step_bytes_accessed"] if r["step_bytes_accessed"] else 0
        est = r["step_estimate_seconds"]
        out.append(
            f"| {r['topology']} | {r['chips']} | {r['batch_size']} | {'yes' if r['fits'] else 'no'} "
            f"| {cli._bytes(r['step_peak_bytes'])} / {r['memory_per_chip'] / 2**30:.2f} GiB "
            f"| {r['step_flops'] / 1e9:.3f} | {inten:.1f} | {est * 1e6:.1f} µs | {r['items_per_s_estimate']:,.0f} "
            f"| {cli._largest(r)} | {sum(p['compile_seconds'] for p in r['programs']):.1f} |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--json")
    p.add_argument("--only", choices=["gpt", "cnn"])
    args = p.parse_args()
    if not available():
        print(install_hint(), file=sys.stderr)
        return 2
    results = {}
    for name, fn, batches in (("gpt", workloads.gpt, [8, 64]), ("cnn", workloads.cnn, [16, 256])):
        if args.only and name != args.only:
            continue
        w = fn()
        t = time.perf_counter()
        rows = cli.workload_rows(w, TOPOLOGIES, batches, (1, 4))
        # The largest batch for one v5e chip only: programs near a chip's
        # size compile slowly (minutes each for the CNN at 200k images).
        searched = cli.workload_rows(w, ["v5e:2x2"], batches[-1:], (1,), largest=True, tolerance=args.tolerance)[0]
        rows = [searched if (r["topology"], r["chips"], r["batch_size"]) == ("v5e:2x2", 1, batches[-1]) else r
                for r in rows]
        results[name] = rows
        print(f"\n### {w.name} ({time.perf_counter() - t:.0f} s to capture and compile all)\n")
        print(md_table(rows))
        phases = {}
        for prog in next(r for r in rows if "error" not in r)["programs"]:
            phases.setdefault(prog["phase"], []).append(prog["name"])
        print("\nprograms per step: " + "; ".join(f"{k}: {len(v)}" for k, v in phases.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
