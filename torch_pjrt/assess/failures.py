"""Failures kept apart by class, since each points to different work:
out of memory, an unsupported op, a compile error, a numerics mismatch, a
runtime error, a timeout. Each record names its stage, frontend, batch size,
op or program, the error text and the next step."""
import re

import torch

KINDS = ("out_of_memory", "unsupported_op", "compile_error", "numerics_mismatch", "runtime_error", "timeout",
         "workload_error")

NEXT_STEPS = {
    "out_of_memory": "use a smaller batch, a lower precision (bfloat16) or more devices; the memory section "
                     "gives the largest batch that fits",
    "unsupported_op": "the op has no lowering: add one (csrc/lowering/ops/, one function) or rewrite the model "
                      "code around it; until then it runs on the CPU or fails",
    "compile_error": "XLA or torch.compile could not build the program: report it with TORCH_PJRT_DUMP=1 output; "
                     "eager mode may still run",
    "numerics_mismatch": "compare layer by layer on both devices (forward hooks) to find the first op that "
                         "differs; check the tolerances and the precision",
    "runtime_error": "read the error; rerun the stage alone (run.stages) with TORCH_PJRT_EAGER=debug to find "
                     "the op",
    "workload_error": "fails on the baseline too: fix the workload (its inputs, shapes or code); this is not "
                      "a migration blocker, but nothing can be assessed where it fails",
    "timeout": "raise run.stage_timeout_s or use fewer iterations and batch sizes; a hang in a stage is a bug "
               "to report",
}

_OP = re.compile(r"(aten::[A-Za-z0-9_.]+)")


def _short(text, lines=12, chars=2000):
    kept = "\n".join(str(text).strip().splitlines()[:lines])
    return kept[:chars]


def classify_exception(exc):
    """(kind, op) for an exception raised by a tpu run (torch.compile's
    wrappers are looked through: an OOM while compiling is an OOM)."""
    inner = getattr(exc, "inner_exception", None) or exc.__cause__
    if inner is not None and inner is not exc:
        kind, op = classify_exception(inner)
        if kind != "runtime_error":
            return kind, op
    text = f"{type(exc).__name__}: {exc}"
    op = _OP.search(text)
    op = op.group(1) if op else None
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text.lower() or "RESOURCE_EXHAUSTED" in text:
        return "out_of_memory", op
    if isinstance(exc, NotImplementedError) or "has no lowering" in text or "not supported on device tpu" in text:
        return "unsupported_op", op
    name = type(exc).__name__
    if (name in ("BackendCompilerFailed", "InternalTorchDynamoError", "Unsupported", "TorchRuntimeError")
            or ("failed in PJRT plugin" in text and "compile" in text)):
        return "compile_error", op
    return "runtime_error", op


def record(kind, stage, error, frontend=None, batch_size=None, op=None, next_step=None):
    assert kind in KINDS, kind
    return {"kind": kind, "stage": stage, "frontend": frontend, "batch_size": batch_size, "op": op,
            "error": _short(error), "next_step": next_step or NEXT_STEPS[kind]}


def from_exception(exc, stage, frontend=None, batch_size=None):
    kind, op = classify_exception(exc)
    return record(kind, stage, f"{type(exc).__name__}: {exc}", frontend, batch_size, op)


def _error_type(f):
    return f["error"].split(":", 1)[0].strip()


def mark_workload_errors(fails):
    """Reclassifies, in place, failures that are the workload's own: every
    failure of the baseline (but out of memory and timeouts, which depend on
    its device), and each tpu failure that the baseline reproduces (the same
    exception type, at the same batch size where both have one). They were
    "unsupported_op: add a lowering" for inputs on the meta device, numpy
    inputs or a shape error that the baseline raises too. Returns the count."""
    base = [f for f in fails if f.get("frontend") == "baseline" and f["kind"] not in ("out_of_memory", "timeout")]
    marked = 0
    for f in fails:
        if f["kind"] in ("out_of_memory", "timeout", "numerics_mismatch", "workload_error"):
            continue
        same = f in base or any(
            _error_type(b) == _error_type(f)
            and (b["batch_size"] is None or f["batch_size"] is None or b["batch_size"] == f["batch_size"])
            for b in base)
        if same:
            f["kind"], f["next_step"] = "workload_error", NEXT_STEPS["workload_error"]
            marked += 1
    return marked
