"""`python -m torch_pjrt readiness WORKLOAD --topology v5e:2x2,v6e:2x2 --batch 1,8,32`:
per topology, chip count and batch size, whether one step of the workload
(WORKLOAD as in the assessment: path/to/file.py:function or module:function
returning a torch_pjrt.assess.Workload) fits a chip and what it costs, as a
table; --json writes every figure. The assessment's "TPU readiness" section
comes from workload_rows()."""
import argparse
import json
import os
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
        try:
            # Inside the try: a batch whose inputs the host cannot allocate is one row's error, like any other.
            example = _example(workload, b)
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


def _counts(option, text):
    """A comma-separated list of integers >= 1 (batch sizes, chip counts)."""
    out = []
    for item in text.split(","):
        try:
            n = int(item)
        except ValueError:
            raise ValueError(f"argument {option}: expected comma-separated integers, got {text!r}") from None
        if n < 1:
            raise ValueError(f"argument {option}: must be >= 1, got {n}")
        out.append(n)
    return out


def _check_writable(option, path):
    """The folder `path` goes in exists and is writable, and `path` is not a folder."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"argument {option}: {path} is a directory")
    if not os.path.isdir(folder):
        raise ValueError(f"argument {option}: cannot write {path}: {folder} is not a directory")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"argument {option}: cannot write {path}: permission denied")


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
    # Usage errors before anything compiles: otherwise found only after every
    # compile (--json), or as a traceback deep in the workload (--batch -3).
    try:
        batches = _counts("--batch", args.batch) if args.batch else None
        chips = _counts("--chips", args.chips)
        if args.max_batch < 1:
            raise ValueError(f"argument --max-batch: must be >= 1, got {args.max_batch}")
        if not args.tolerance >= 0:  # also NaN
            raise ValueError(f"argument --tolerance: must be >= 0 (a fraction), got {args.tolerance}")
        if args.json:
            _check_writable("--json", args.json)
    except ValueError as e:
        print(f"torch_pjrt readiness: error: {e}", file=sys.stderr)
        return 2
    if not available():
        print(f"torch_pjrt readiness: {install_hint()}", file=sys.stderr)
        return 2
    from torch_pjrt.assess.workload import load_spec
    try:
        workload = load_spec(args.workload)
    except SyntaxError as e:  # the workload file itself: one line, as the assessment reports it
        print(f"torch_pjrt readiness: SyntaxError: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, AttributeError, TypeError, ImportError) as e:
        print(f"torch_pjrt readiness: {e}", file=sys.stderr)
        return 2
    batches = batches or list(workload.batch_sizes)
    rows = workload_rows(workload, args.topology.split(","), batches, chips, args.largest, args.save_dir,
                         args.tolerance, args.max_batch)
    print(f"{workload.name}, {workload.precision}; memory: XLA's compiled statistics; "
          "step time and items/s: roofline ESTIMATES from published peaks, not measurements")
    print(_table(rows))
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        except OSError as e:  # checked up front, but the disk can still fill or the folder go
            print(f"torch_pjrt readiness: cannot write --json {args.json}: {e}", file=sys.stderr)
            return 1
        print(f"figures: {args.json}")
    return 0 if all("error" not in r for r in rows) else 1
