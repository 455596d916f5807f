"""Op coverage of a workload on tpu: every ATen op it runs, with its count,
classified as lowered (a lowering or a tpu kernel of ours), decomposed
(PyTorch's composite kernel, made of lowered ops), CPU fallback (with the
time it took) or failing; graph breaks under torch.compile with their reasons
and user source lines; recompiles across the batch sweep and their causes."""
import collections
import time

import torch
import torch.utils._pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _state
from . import failures
from .steps import Runner, synchronize


def _op_name(func):
    schema = func._schema
    return schema.name + ("." + schema.overload_name if schema.overload_name else "")


def _has_tpu_kernel(func):
    # A kernel of ours (views, copies, factories, routed composites).
    return torch._C._dispatch_has_kernel_for_dispatch_key(_op_name(func), "PrivateUse1")


def _lowered(func):
    base = func._schema.name.split("::", 1)[-1]
    if base.endswith("_") and not base.startswith("__"):
        base = base[:-1]
    if base.startswith("_foreach_"):
        base = base[len("_foreach_"):]
    return _state.C.find_lowering(base, func._schema.overload_name) is not None


def _on_tpu(args, kwargs):
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    return any(isinstance(x, torch.Tensor) and x.device.type == "tpu" or
               isinstance(x, torch.device) and x.type == "tpu" for x in leaves)


class OpCounter(TorchDispatchMode):
    """Counts and classifies the ATen ops that reach the device (PyTorch's
    CompositeImplicit ops have decomposed before this level)."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()
        self.classes = {}
        self.fallback_seconds = collections.Counter()
        self.errors = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not _on_tpu(args, kwargs):  # host work (e.g. an optimizer's step counts on the CPU)
            return func(*args, **(kwargs or {}))
        name = _op_name(func)
        before = _state.C.cpu_fallback_calls()
        t0 = time.perf_counter()
        try:
            out = func(*args, **(kwargs or {}))
        except Exception as e:
            self.counts[name] += 1
            self.classes[name] = "failing"
            self.errors.setdefault(name, e)
            raise
        self.counts[name] += 1
        if _state.C.cpu_fallback_calls() > before:
            self.classes[name] = "cpu_fallback"
            self.fallback_seconds[name] += time.perf_counter() - t0  # fallbacks wait for their copies
        elif name not in self.classes:
            self.classes[name] = "lowered" if _lowered(func) or _has_tpu_kernel(func) else "decomposed"
        return out


def op_coverage(workload, batch_size, frontend="eager"):
    """Runs one call with every op counted; returns (coverage dict, failure or None)."""
    runner = Runner(workload, "tpu", frontend)
    inputs = runner.inputs(batch_size)
    try:
        runner(inputs)  # compiles, so the counted call is a warm one
    except Exception:  # noqa: BLE001
        # An op that fails fails again in the counted call below, where the
        # counter sees it (raised here, outside the counter, it aborted the
        # stage and coverage never showed a failing op).
        pass
    counter = OpCounter()
    failure = None
    t0 = time.perf_counter()
    try:
        with counter:
            runner(inputs)
    except Exception as e:  # noqa: BLE001  (reported as a failure of its class)
        failure = failures.from_exception(e, "coverage", frontend, batch_size)
    synchronize("tpu")
    total = time.perf_counter() - t0
    ops = [{"op": op, "count": n, "class": counter.classes.get(op, "lowered"),
            "seconds": counter.fallback_seconds.get(op) if counter.classes.get(op) == "cpu_fallback" else None}
           for op, n in sorted(counter.counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    summary = collections.Counter(o["class"] for o in ops)
    fallback = sum(counter.fallback_seconds.values())
    return {
        "ops": ops,
        "summary": {c: summary.get(c, 0) for c in ("lowered", "decomposed", "cpu_fallback", "failing")}
        | {"total_calls": sum(counter.counts.values())},
        "fallback_time_share": fallback / total if total > 0 else 0.0,
    }, failure


def graph_breaks(workload, batch_size):
    """torch._dynamo.explain of the model's forward: graphs, breaks and where."""
    import torch._dynamo
    runner = Runner(workload, "tpu", "eager")
    inputs = runner.inputs(batch_size)
    if workload.mode == "training":
        inputs = inputs[0]  # (inputs, targets): the model sees the inputs
    model = runner.model
    if workload.mode == "generation":
        inputs = _with_decoder_start(model, inputs)
    if isinstance(inputs, dict):
        out = torch._dynamo.explain(model)(**inputs)
    elif isinstance(inputs, tuple):
        out = torch._dynamo.explain(model)(*inputs)
    else:
        out = torch._dynamo.explain(model)(inputs)
    breaks = []
    for r in out.break_reasons:
        frames = [f"{f.filename}:{f.lineno} in {f.name}" for f in (r.user_stack or [])][-3:]
        breaks.append({"reason": str(r.reason).strip().splitlines()[0][:300], "user_frames": frames})
    torch._dynamo.reset()
    return out.graph_count, breaks


def _with_decoder_start(model, inputs):
    """generate() starts an encoder-decoder's decoder itself (T5, Bart); the
    plain forward explained here needs the decoder's first token."""
    config = getattr(model, "config", None)
    if (not isinstance(inputs, dict) or "decoder_input_ids" in inputs or not inputs
            or not getattr(config, "is_encoder_decoder", False)):
        return inputs
    start = getattr(getattr(model, "generation_config", None), "decoder_start_token_id", None)
    if start is None:
        start = getattr(config, "decoder_start_token_id", None)
    first = next(iter(inputs.values()))  # input_ids, or Whisper's input_features
    return {**inputs, "decoder_input_ids": torch.full((first.shape[0], 1), int(start or 0), dtype=torch.long,
                                                      device=first.device)}


def recompiles(workload, batch_sizes):
    """Runs the compiled workload over the sweep; the recompiles each batch size caused."""
    from .._compile import stats
    runner = Runner(workload, "tpu", "compiled")
    events, errors = [], []
    for bs in batch_sizes:
        seen = len(stats.HISTORY["recompiles"])
        try:
            runner(runner.inputs(bs))
        except Exception as e:  # noqa: BLE001
            errors.append(failures.from_exception(e, "coverage", "compiled", bs))
            break
        for message in list(stats.HISTORY["recompiles"])[seen:]:
            graph = message.split("'")[1] if "'" in message else None
            if len(message) > 400:  # a graph with many inputs lists each changed one
                message = message[:400] + f" ... ({len(message) - 400} more characters)"
            events.append({"batch_size": bs, "graph": graph, "reason": message})
    return events, errors
