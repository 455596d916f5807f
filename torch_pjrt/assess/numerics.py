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


def named_values(outputs):
    """[(name, tensor, is_number)]: the tensors of a (nested) output and its
    Python numbers (bool, int, float; a 0-d tensor each), so a model that
    returns `loss.item()` or a dict of floats is compared too (its outputs
    were "0 compared" and passed whatever tpu returned)."""
    leaves, _ = pytree.tree_flatten_with_path(outputs)
    named = []
    for path, leaf in leaves:
        name = "output" + "".join(str(k) for k in path) if path else "output"
        if isinstance(leaf, torch.Tensor):
            named.append((name, leaf.detach(), False))
        elif isinstance(leaf, (bool, int, float)):
            dtype = torch.bool if isinstance(leaf, bool) else torch.int64 if isinstance(leaf, int) else torch.float64
            named.append((name, torch.tensor(leaf, dtype=dtype), True))
    return named


def _nonfinite(x):
    return {"nan": int(torch.isnan(x).sum()), "inf": int(torch.isinf(x).sum())}


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
        # NaN/inf are said, not hidden: NaN on both sides at the same places
        # counts as equal (above), which passed a model that only makes NaN.
        nb, nt = _nonfinite(bd), _nonfinite(td)
        if any(nb.values()) or any(nt.values()):
            row["nonfinite"] = {"baseline": nb, "target": nt}
            both = any(nb.values()) and any(nt.values())
            row["note"] = (("NaN/inf on both sides" if both else
                            "NaN/inf on tpu only" if any(nt.values()) else "NaN/inf on the baseline only")
                           + f": baseline {nb['nan']} NaN, {nb['inf']} inf; tpu {nt['nan']} NaN, {nt['inf']} inf")
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
        return {"name": "token agreement (greedy)", "baseline": 1.0, "baseline_is_reference": True,
                "target": agree, "threshold": 1.0, "pass": agree >= 1.0}
    lb, lt = _logits(base_out), _logits(target_out)
    if lb is None or lt is None or lb.shape != lt.shape:
        return None
    agree = float((lb.cpu().argmax(-1) == lt.cpu().argmax(-1)).double().mean())
    # "baseline" 1.0 is the reference (the baseline agrees with itself), not a measured score.
    return {"name": "top-1 agreement", "baseline": 1.0, "baseline_is_reference": True, "target": agree,
            "threshold": 0.99, "pass": agree >= 0.99}


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


BASELINE_SEEDS = (1, 2)  # torch's seed before each of the two baseline runs (different on purpose)


def _compare_trees(workload, base_out, out, frontend):
    """(rows, pairs compared): each tensor or Python number of `out` against
    the same one of `base_out`, with its dtype's tolerance (a Python number:
    the workload's precision's)."""
    rows = []
    named_b, named_t = named_values(base_out), named_values(out)
    for (name, b, number), (_, t, _) in zip(named_b, named_t):
        rtol, atol = workload.tolerance(workload.dtype if number and b.is_floating_point() else b.dtype)
        row = compare(name, b, t, rtol, atol)
        if number:
            row["dtype"] = "python " + {torch.bool: "bool", torch.int64: "int"}.get(b.dtype, "float")
        rows.append({"frontend": frontend, **row})
    if len(named_b) != len(named_t):
        rows.append({"frontend": frontend, "name": "outputs", "pass": False, "error":
                     f"{len(named_t)} outputs on tpu, {len(named_b)} on the baseline"})
    return rows, min(len(named_b), len(named_t))


def _run_baseline(workload, device, batch_size, train_steps, seed):
    """run_side on the baseline with torch seeded `seed` after the model is
    built (a model factory seeds torch itself), an error tagged as the
    baseline's (the report then says the workload fails there too, not tpu)."""
    try:
        runner = Runner(workload, device)
        torch.manual_seed(seed)
        return run_side(runner, batch_size, train_steps)
    except Exception as e:
        e.assess_side, e.assess_batch = "baseline", batch_size
        raise


def compare_sides(workload, baseline_device, frontends, batch_size, train_steps, loss_rtol=0.02, baseline=None):
    """Runs both sides; returns the numerics dict (with the baseline's
    outputs and losses, to save). `baseline`: those captured elsewhere
    (--against), instead of running the baseline here.

    The baseline runs twice, torch seeded differently before each run: a
    model whose outputs depend on random ops in its forward (dropout left on,
    torch.rand...) or on unseeded weights disagrees with itself, and tpu
    cannot be expected to match it; numerics then say "not comparable"
    instead of failing. (Seeding both runs the same would hide it: a model
    factory that calls manual_seed gives both the same dropout masks, and tpu,
    with its own generator, other ones.)"""
    base_in = workload.inputs(batch_size, "cpu")
    unstable = _differs(base_in, workload.inputs(batch_size, "cpu"))
    self_rows = []
    if baseline is None:
        with torch.random.fork_rng(devices=[]):
            base_out, base_losses = _run_baseline(workload, baseline_device, batch_size, train_steps,
                                                  BASELINE_SEEDS[0])
            again_out, again_losses = _run_baseline(workload, baseline_device, batch_size, train_steps,
                                                    BASELINE_SEEDS[1])
        self_rows, _ = _compare_trees(workload, base_out, again_out, "baseline")
        if base_losses and again_losses and not math.isclose(base_losses[-1], again_losses[-1], rel_tol=loss_rtol,
                                                             abs_tol=1e-4):
            self_rows.append({"pass": False})
    else:
        base_out, base_losses = baseline["outputs"], baseline.get("losses")
    comparable = all(r["pass"] for r in self_rows)
    rows, metric, compared = [], None, 0
    curves = {"baseline": base_losses} if base_losses is not None else None
    for frontend in frontends:
        out, losses = run_side(Runner(workload, "tpu", frontend), batch_size, train_steps)
        frontend_rows, n = _compare_trees(workload, base_out, out, frontend)
        rows.extend(frontend_rows)
        compared += n
        if unstable:  # (other randomness than torch's: numpy, random, time)
            rows.append({"frontend": frontend, "name": "inputs", "pass": False, "error":
                         "make_inputs gave other values on a second call with torch's generator seeded the same: "
                         "the baseline and tpu computed different inputs (seed numpy/random in make_inputs)"})
        if metric is None:
            metric = task_metric(workload, base_out, out, base_in)
        if curves is not None:
            curves[frontend] = losses
    ok = all(r["pass"] for r in rows) and (metric is None or metric["pass"])
    if curves:
        ok = ok and all(math.isclose(c[-1], curves["baseline"][-1], rel_tol=loss_rtol, abs_tol=1e-4)
                        for name, c in curves.items() if name != "baseline" and c and curves["baseline"])
    status, note = "measured", None
    if not comparable:
        # Not a failure of tpu: nothing to hold it to. Rows stay for reading, judged by no one.
        status, ok = "not_comparable", None
        note = ("not comparable: the model's outputs differ between two baseline runs (random ops in forward, "
                "e.g. dropout in training mode, or unseeded weights?)")
        for r in rows:
            r["pass"] = None
        if metric:
            metric["pass"] = None
    elif not compared and metric is None and not curves and all(r["pass"] for r in rows):
        # Zero outputs compared is no evidence: it read as "pass" while tpu's value was wrong.
        status, ok = "nothing_compared", None
        note = ("not measured: the model returned nothing comparable (no tensors or Python numbers in its "
                "outputs)")
    return {"outputs": rows, "task_metric": metric, "loss_curve": curves, "pass": ok, "status": status,
            "note": note, "baseline_outputs": base_out, "baseline_losses": base_losses}
