"""Numerics: identical weights and inputs on the baseline device and on tpu;
per output the max abs and relative error, cosine similarity, the share of
elements out of tolerance (allclose's rule), pass/fail per dtype; the task
metric on both sides; for training, the loss curve of N steps on both."""
import math

import torch
import torch.utils._pytree as pytree

from .steps import Runner

HISTOGRAM_EDGES = list(range(-12, 3))  # log10 |error| bins


def named_tensors(outputs):
    """[(name, tensor)] of the tensors in a (nested) output, e.g. ("logits", t)."""
    leaves, _ = pytree.tree_flatten_with_path(outputs)
    named = []
    for path, leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            name = "output" + "".join(str(k) for k in path) if path else "output"
            named.append((name, leaf.detach()))
    return named


def compare(name, base, target, rtol, atol):
    """One output's error figures (both on the CPU, compared in float64)."""
    b, t = base.detach().cpu(), target.detach().cpu()
    row = {"name": name, "dtype": str(b.dtype).replace("torch.", ""), "shape": list(b.shape), "rtol": rtol,
           "atol": atol}
    if b.shape != t.shape or b.dtype != t.dtype:
        row.update(max_abs=None, max_rel=None, cosine=None, out_of_tolerance=1.0, pass_=False,
                   error=f"shape/dtype {tuple(t.shape)} {t.dtype} on tpu, {tuple(b.shape)} {b.dtype} on baseline")
    elif not (b.is_floating_point() or b.is_complex()):
        bad = (b != t).double().mean().item() if b.numel() else 0.0
        row.update(max_abs=float((b.double() - t.double()).abs().max()) if b.numel() else 0.0, max_rel=None,
                   cosine=None, out_of_tolerance=bad, pass_=bad == 0.0)
    else:
        bd, td = b.double(), t.double()
        both_nan = torch.isnan(bd) & torch.isnan(td)
        diff = torch.where(both_nan, torch.zeros_like(bd), (bd - td).abs())
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
        ok = diff <= atol + rtol * bd.abs().nan_to_num(nan=0.0)
        rel = diff / bd.abs().clamp_min(max(atol, 1e-30))
        fb, ft = bd.flatten().nan_to_num(), td.flatten().nan_to_num()
        denom = fb.norm() * ft.norm()
        cosine = float((fb @ ft) / denom) if denom > 0 else (1.0 if torch.equal(fb, ft) else 0.0)
        finite = diff[torch.isfinite(diff) & (diff > 0)]
        counts = torch.histc(finite.log10().clamp(HISTOGRAM_EDGES[0], HISTOGRAM_EDGES[-1]),
                             bins=len(HISTOGRAM_EDGES) - 1, min=HISTOGRAM_EDGES[0],
                             max=HISTOGRAM_EDGES[-1]) if finite.numel() else torch.zeros(len(HISTOGRAM_EDGES) - 1)
        share = 1.0 - ok.double().mean().item() if b.numel() else 0.0
        row.update(max_abs=float(diff.max()) if b.numel() else 0.0, max_rel=float(rel.max()) if b.numel() else 0.0,
                   cosine=cosine, out_of_tolerance=share, pass_=share == 0.0,
                   abs_error_histogram={"edges_log10": HISTOGRAM_EDGES, "counts": [int(c) for c in counts],
                                        "exact": int((diff == 0).sum())})
    row["pass"] = row.pop("pass_")
    return row


def _logits(outputs):
    named = named_tensors(outputs)
    if named and named[0][1].is_floating_point() and named[0][1].dim() >= 2 and named[0][1].shape[-1] > 1:
        return named[0][1]
    return None


def task_metric(workload, base_out, target_out, base_in):
    """The workload's metric on both sides, else top-1 / token agreement."""
    if workload.task_metric is not None:
        b = float(workload.task_metric(base_out, base_in))
        t = float(workload.task_metric(target_out, base_in))
        return {"name": workload.task_metric_name, "baseline": b, "target": t,
                "threshold": workload.task_metric_tolerance, "pass": abs(b - t) <= workload.task_metric_tolerance}
    if workload.mode == "generation":
        b, t = base_out.cpu(), target_out.cpu()
        agree = float((b == t).double().mean()) if b.shape == t.shape else 0.0
        return {"name": "token agreement (greedy)", "baseline": 1.0, "target": agree, "threshold": 1.0,
                "pass": agree >= 1.0}
    lb, lt = _logits(base_out), _logits(target_out)
    if lb is None or lt is None or lb.shape != lt.shape:
        return None
    agree = float((lb.cpu().argmax(-1) == lt.cpu().argmax(-1)).double().mean())
    return {"name": "top-1 agreement", "baseline": 1.0, "target": agree, "threshold": 0.99, "pass": agree >= 0.99}


def _to_cpu(tree):
    return pytree.tree_map(lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, tree)


def _differs(a, b):
    """Whether two input trees differ (structure, dtypes or values; NaN equals NaN)."""
    try:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    except AssertionError:
        return True
    except Exception:  # noqa: BLE001 - inputs assert_close cannot compare (strings...): not judged
        return False
    return False


def run_side(runner, batch_size, train_steps):
    """(outputs on the CPU, losses or None): one call, or `train_steps`
    training steps on the same batch (the outputs of the first)."""
    inputs = runner.inputs(batch_size)
    if runner.workload.mode != "training":
        return _to_cpu(runner(inputs)), None
    out, loss = runner(inputs)
    losses = [float(loss)]
    while len(losses) < train_steps:
        losses.append(float(runner(inputs)[1]))
    return _to_cpu(out), losses


def compare_sides(workload, baseline_device, frontends, batch_size, train_steps, loss_rtol=0.02, baseline=None):
    """Runs both sides; returns the numerics dict (with the baseline's
    outputs and losses, to save). `baseline`: those captured elsewhere
    (--against), instead of running the baseline here."""
    base_in = workload.inputs(batch_size, "cpu")
    unstable = _differs(base_in, workload.inputs(batch_size, "cpu"))
    if baseline is None:
        base_out, base_losses = run_side(Runner(workload, baseline_device), batch_size, train_steps)
    else:
        base_out, base_losses = baseline["outputs"], baseline.get("losses")
    rows, metric = [], None
    curves = {"baseline": base_losses} if base_losses is not None else None
    for frontend in frontends:
        out, losses = run_side(Runner(workload, "tpu", frontend), batch_size, train_steps)
        named_b, named_t = named_tensors(base_out), named_tensors(out)
        for (name, b), (_, t) in zip(named_b, named_t):
            rtol, atol = workload.tolerance(b.dtype)
            rows.append({"frontend": frontend, **compare(name, b, t, rtol, atol)})
        if unstable:  # (other randomness than torch's: numpy, random, time)
            rows.append({"frontend": frontend, "name": "inputs", "pass": False, "error":
                         "make_inputs gave other values on a second call with torch's generator seeded the same: "
                         "the baseline and tpu computed different inputs (seed numpy/random in make_inputs)"})
        if len(named_b) != len(named_t):
            rows.append({"frontend": frontend, "name": "outputs", "pass": False, "error":
                         f"{len(named_t)} output tensors on tpu, {len(named_b)} on the baseline"})
        if metric is None:
            metric = task_metric(workload, base_out, out, base_in)
        if curves is not None:
            curves[frontend] = losses
    ok = all(r["pass"] for r in rows) and (metric is None or metric["pass"])
    if curves:
        ok = ok and all(math.isclose(c[-1], curves["baseline"][-1], rel_tol=loss_rtol, abs_tol=1e-4)
                        for name, c in curves.items() if name != "baseline" and c and curves["baseline"])
    return {"outputs": rows, "task_metric": metric, "loss_curve": curves, "pass": ok,
            "baseline_outputs": base_out, "baseline_losses": base_losses}
