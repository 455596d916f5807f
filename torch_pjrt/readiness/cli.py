"""`python -m torch_pjrt readiness WORKLOAD --topology v5e:2x2,v6e:2x2 --batch 1,8,32`:
per topology, chip count and batch size, whether one step of the workload
(WORKLOAD as in the assessment: path/to/file.py:function or module:function
returning a torch_pjrt.assess.Workload) fits a chip and what it costs, as a
table; --json writes every figure. The assessment's "TPU readiness" section
comes from workload_rows()."""
import argparse
import json
import sys

import torch

from . import install_hint, available, LibtpuMissing


class _WithLoss(torch.nn.Module):
    """A training workload as one module returning its loss (the readiness
    step compiles model and loss together)."""

    def __init__(self, workload):
        super().__init__()
        self.model = workload.build_model()
        self.loss_fn = workload.loss_fn

    def forward(self, inputs, targets):
        from torch_pjrt.assess.workload import call
        return self.loss_fn(call(self.model, inputs), targets)


def _example(workload, batch):
    inputs = workload.inputs(batch, "cpu")
    if workload.mode == "training":
        return inputs, workload.inputs(batch, "cpu", targets=True)
    # A dict is keyword arguments (a Hugging Face batch); generation is checked
    # as one forward over the prompt (the prefill), not the decoding loop.
    return inputs if isinstance(inputs, (tuple, dict)) else (inputs,)


def workload_rows(workload, topologies, batches, chips=(1,), largest=False, save_dir=None, tolerance=0.02,
                  max_batch=1 << 20):
    """One dict per (topology, chips, batch): the Report's figures, or the
    error. Each batch's step is captured once and compiled for every topology."""
    from . import core, search
    training = workload.mode == "training"
    mode = "training" if training else "inference"
    model = _WithLoss(workload) if training else workload.build_model()
    rows = []
    captures = {}  # batch -> captured step, shared by every topology's largest-batch search
    for b in batches:
        example = _example(workload, b)
        try:
            programs, persistent = captures[b] = core.capture_step(model, example, mode, workload.optimizer)
            captured = None
        except Exception as e:  # noqa: BLE001  (e.g. an op with no lowering: no program for any topology)
            captured = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        for topo in topologies:
            for n in chips:
                row = {"topology": topo, "chips": n, "batch_size": b}
                try:
                    if captured:
                        raise RuntimeError(captured)
                    r = core.check_programs(programs, persistent, topo, n, mode, b, save_dir)
                    if largest and b == batches[-1]:
                        r.largest_batch, r.smallest_not_fitting = search(
                            model, example, topo, mode, workload.optimizer, n, known=(b, r.step_peak_bytes),
                            captures=captures, tolerance=tolerance, max_batch=max_batch)
                        row["largest_batch_searched_up_to"] = max_batch
                    row.update(r.to_dict())
                    row["items_per_s_estimate"] = (workload.items(b) / r.step_estimate_seconds
                                                   if r.step_estimate_seconds else None)
                except LibtpuMissing:
                    raise
                except Exception as e:  # noqa: BLE001  (one configuration failing keeps the others)
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                rows.append(row)
    return rows


def _bytes(n):
    if abs(n) >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if abs(n) >= 2**20 else f"{n / 2**10:.1f} KiB"


def _seconds(s):
    if not s:
        return "-"
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _largest(r):
    """"L" (exact), "L (<N)" (N: the smallest batch compiled and found too big), or "-"."""
    lo, hi = r.get("largest_batch"), r.get("smallest_not_fitting")
    if lo is None:
        return "none" if hi else "-"
    cap = r.get("largest_batch_searched_up_to")
    if hi is None and cap and lo >= cap // r["chips"] * r["chips"]:
        return f">= {lo}"  # fits at the search's limit
    return str(lo) if hi is None or hi - lo <= r["chips"] else f"{lo} (<{hi})"


def _table(rows):
    head = ["topology", "chips", "batch", "fits", "peak / chip memory", "margin", "GFLOP/step", "intensity",
            "step (estimate)", "items/s (estimate)", "largest batch"]
    lines = ["  ".join(f"{h:>12}" for h in head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['topology']:>12}  {r['chips']:>12}  {r['batch_size']:>12}  error: {r['error']}")
            continue
        gib = 2**30
        intensity = r["step_flops"] / r["step_bytes_accessed"] if r["step_bytes_accessed"] else 0.0
        cells = [r["topology"], r["chips"], r["batch_size"], "yes" if r["fits"] else "NO",
                 f"{_bytes(r['step_peak_bytes'])} / {r['memory_per_chip'] / gib:.2f} GiB",
                 _bytes(r["margin_bytes"]), f"{r['step_flops'] / 1e9:.3g}", f"{intensity:.1f}",
                 _seconds(r["step_estimate_seconds"]),
                 f"{r['items_per_s_estimate']:.0f}" if r.get("items_per_s_estimate") else "-",
                 _largest(r)]
        lines.append("  ".join(f"{str(c):>12}" for c in cells))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m torch_pjrt readiness",
        description="Compile one step of a workload for TPU topologies with libtpu (no TPU needed): does it fit "
                    "a chip, flops and bytes per step, a roofline step-time estimate.")
    p.add_argument("workload", help="path/to/file.py:function or module:function returning a Workload")
    p.add_argument("--topology", default="v5e:2x2", help="comma-separated, e.g. v5e:2x2,v6e:2x2,v5p:2x2x1")
    p.add_argument("--batch", default=None, help="comma-separated batch sizes (default: the workload's)")
    p.add_argument("--chips", default="1", help="comma-separated chip counts: the batch split across them")
    p.add_argument("--largest", action="store_true", help="also search the largest batch that fits (compiles more)")
    p.add_argument("--max-batch", type=int, default=1 << 20, help="largest-batch search: up to this batch")
    p.add_argument("--tolerance", type=float, default=0.02,
                   help="largest-batch search: stop when the smallest batch found too big is within this fraction "
                        "(default 0.02; 0 = exact, more compiles)")
    p.add_argument("--json", metavar="FILE", help="write every figure there")
    p.add_argument("--save-dir", metavar="DIR", help="serialized executables and scheduled HLO text go there")
    args = p.parse_args(argv)
    if not available():
        print(f"torch_pjrt readiness: {install_hint()}", file=sys.stderr)
        return 2
    from torch_pjrt.assess.workload import load_spec
    try:
        workload = load_spec(args.workload)
        batches = [int(b) for b in args.batch.split(",")] if args.batch else list(workload.batch_sizes)
        chips = [int(c) for c in args.chips.split(",")]
    except (ValueError, FileNotFoundError, AttributeError, TypeError, ImportError) as e:
        print(f"torch_pjrt readiness: {e}", file=sys.stderr)
        return 2
    rows = workload_rows(workload, args.topology.split(","), batches, chips, args.largest, args.save_dir,
                         args.tolerance, args.max_batch)
    print(f"{workload.name}, {workload.precision}; memory: XLA's compiled statistics; "
          "step time and items/s: roofline ESTIMATES from published peaks, not measurements")
    print(_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"figures: {args.json}")
    return 0 if all("error" not in r for r in rows) else 1
