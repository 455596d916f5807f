"""torch.compile(model) with no backend (or backend="inductor") on tpu tensors.

PyTorch's Inductor claims the device name "tpu" for its own Pallas code
generator (it needs JAX and a real TPU), so the default backend fails on our
device with "No module named 'jax'". torch.compile turns backend="inductor"
into a torch._TorchCompileInductorWrapper and calls it with each captured
graph; graphs that touch a tpu tensor go to backend="tpu" instead, every other
graph to Inductor as before. PyTorch offers no hook for this choice: the
narrow override below is the one place we replace PyTorch behaviour (upstream
fix: let an out-of-tree PrivateUse1 backend register the Dynamo backend
Inductor's wrapper should defer to, see docs/upstream_notes.md).
"""
import logging

import torch

log = logging.getLogger("torch_pjrt")
_installed = False


def _is_tpu(value):
    return isinstance(value, torch.Tensor) and value.device.type == "tpu"


def graph_uses_tpu(gm, example_inputs):
    """Whether a captured graph takes or makes a tpu tensor (inputs, then the
    example values Dynamo records on each node, e.g. torch.ones(device="tpu"))."""
    if any(_is_tpu(a) for a in example_inputs):
        return True
    for node in getattr(getattr(gm, "graph", None), "nodes", ()):
        val = node.meta.get("example_value", node.meta.get("val"))
        vals = val if isinstance(val, (tuple, list)) else (val,)
        if any(_is_tpu(v) for v in vals):
            return True
    return False


def install():
    """Routes Inductor's tpu graphs to backend="tpu" (idempotent)."""
    global _installed
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if _installed or wrapper is None:
        return
    inductor_call = wrapper.__call__

    def __call__(self, model_, inputs_, **kwargs):
        if not graph_uses_tpu(model_, inputs_):
            return inductor_call(self, model_, inputs_, **kwargs)
        from .backend import tpu_backend
        settings = getattr(self, "config", None) or {}
        log.info("torch_pjrt: torch.compile's default backend (inductor) got a graph on tpu; "
                 "compiling it with backend=\"tpu\"%s",
                 f" (Inductor settings ignored: {sorted(settings)})" if settings else "")
        return tpu_backend(model_, inputs_)

    __call__.__wrapped__ = inductor_call
    wrapper.__call__ = __call__
    _installed = True
