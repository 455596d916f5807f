"""Why XLA refused a compiled graph, in CPU's words. A lowering given a dtype
CPU's kernel does not take (bool remainder, integer softmax or
logcumsumexp) emits StableHLO the verifier rejects, and the user saw MLIR.
Eager asks CPU before each op; a graph is asked only when XLA fails: each
op is rerun on CPU with zero-filled inputs of the graph's dtypes and shapes,
and the first NotImplementedError CPU raises (its dtype refusals) is raised
instead, naming the op and the user's line."""
import torch
import torch.fx
from torch.utils import _pytree as pytree

# Ops whose inputs hold more elements than this are not rerun (the probe
# would cost as much as the op).
_MAX_ELEMENTS = 1 << 16


def _probe_value(v):
    if isinstance(v, torch.fx.Node):
        v = v.meta.get("val")
    if isinstance(v, torch.Tensor):
        if any(not isinstance(s, int) for s in v.shape) or v.numel() > _MAX_ELEMENTS:
            raise _Skip
        return torch.zeros(v.shape, dtype=v.dtype)
    if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise _Skip
    if isinstance(v, torch.device):
        return torch.device("cpu")
    return v


class _Skip(Exception):
    pass


def cpu_refusal(gm, graph_name):
    """CPU's NotImplementedError for the first op of `gm` it refuses, or None."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        try:
            args, kwargs = pytree.tree_map(_probe_value, (node.args, node.kwargs))
        except _Skip:
            continue
        if "device" in kwargs:
            kwargs["device"] = torch.device("cpu")
        try:
            node.target(*args, **kwargs)
        except NotImplementedError as e:
            where = ""
            trace = (node.meta.get("stack_trace") or "").strip().splitlines()
            frames = [line.strip() for line in trace if line.strip().startswith("File ")]
            if frames:
                where = f", {frames[-1]}"
            return NotImplementedError(f"{e} (torch_pjrt: {node.target} in compiled graph '{graph_name}'{where})")
        except Exception:  # noqa: BLE001  (zero-filled values CPU rejects: not a dtype refusal)
            continue
    return None
