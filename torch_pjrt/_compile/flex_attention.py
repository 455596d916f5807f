"""flex_attention on tpu.

torch.nn.attention.flex_attention refuses every device outside a fixed list
(_validate_device: cuda, cpu, xpu, hpu, mps) before it does anything
device-specific. On tpu its eager path (the higher-order op's math
implementation, materialising the scores) and its compiled path (Dynamo ->
backend="tpu", or the default backend, see default_backend.py) run unchanged,
backward included, so the check is let through for tpu and kept for every
other device. Upstream fix: accept the PrivateUse1 backend's name in that
list (docs/upstream_notes.md).
"""
import torch

_installed = False


def install():
    global _installed
    if _installed:
        return
    try:
        import torch.nn.attention.flex_attention as fa  # ~4 ms, no Dynamo import
    except ImportError:
        return
    check = getattr(fa, "_validate_device", None)
    if check is None:
        return

    def _validate_device(query, key, value):
        if query.device.type == "tpu":
            return None
        return check(query, key, value)

    _validate_device.__wrapped__ = check
    fa._validate_device = _validate_device
    _installed = True
