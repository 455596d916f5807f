"""safetensors for tpu tensors.

safetensors 0.8 checks device strings in Rust against a fixed list (cpu, cuda,
mps, npu, xpu, xla, mlu, musa, hpu, or a bare integer), so
`safetensors.torch.load_file(path, device="tpu")` and
`safe_open(path, framework="pt", device="tpu")` raise "device tpu is invalid".
A bare integer (`device=0`) does load onto tpu:0 when tpu is PyTorch's current
accelerator (safetensors calls `tensor.to(0)`, which PyTorch resolves to the
current accelerator), but it means cuda:0 on a machine that also has CUDA.

These helpers take any device ("tpu", "tpu:1", torch.device, ...): tensors are
read on the CPU (memory-mapped, as safetensors does) and each is moved with one
host-to-device transfer, dtype and shape unchanged. `safe_open` is lazy: a
tensor (or a slice of it) is read and moved when asked for.

    from torch_pjrt.integrations import safetensors as st
    state = st.load_file("model.safetensors", device="tpu")
    with st.safe_open("model.safetensors", framework="pt", device="tpu") as f:
        w = f.get_tensor("lm_head.weight")          # on tpu
        rows = f.get_slice("wte.weight")[:16]       # only these rows read, then moved
    st.save_file(state, "copy.safetensors")         # tpu tensors are copied to the host to be written

`save_file` / `save` are safetensors' own (they copy non-CPU tensors to the
host); they are re-exported so one import serves both directions.

Libraries call stock safetensors with the device they were given
(accelerate's `load_state` on several devices, `load_checkpoint_and_dispatch`
with `device_map={"": "tpu"}`), so `patch_stock()`, run by
`torch_pjrt.integrations.install()` when safetensors is imported, routes a
tpu device given to stock `safe_open` (and so `safetensors.torch.load_file`
and `load_model`) through these helpers. Every other device goes to
safetensors unchanged; only what would have raised "device tpu is invalid"
changes.
"""
import os
import sys
from typing import Dict, Optional, Union

import torch
import safetensors
import safetensors.torch as _st

__all__ = ["load_file", "load", "safe_open", "save_file", "save", "load_model"]

save_file = _st.save_file
save = _st.save
_MARK = "_torch_pjrt_patched"
# safetensors' own safe_open, whatever patch_stock() later puts in its place.
_stock_safe_open = getattr(safetensors.safe_open, "__wrapped__", safetensors.safe_open)


def _device(device):
    return torch.device(device)     # an int is the current accelerator's device, as in safetensors


def _move(tensor, device):
    return tensor if device.type == "cpu" else tensor.to(device)


def load_file(filename: Union[str, os.PathLike], device: Union[str, int, torch.device] = "tpu",
              ) -> Dict[str, torch.Tensor]:
    """As safetensors.torch.load_file, onto any device (default tpu)."""
    device = _device(device)
    with safe_open(filename, framework="pt", device=device) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def load(data: bytes, device: Union[str, int, torch.device] = "tpu") -> Dict[str, torch.Tensor]:
    """As safetensors.torch.load (from bytes), onto any device (default tpu)."""
    device = _device(device)
    return {k: _move(v, device) for k, v in _st.load(data).items()}


def load_model(model: torch.nn.Module, filename: Union[str, os.PathLike], strict: bool = True,
               device: Union[str, int, torch.device] = "tpu"):
    """As safetensors.torch.load_model, onto any device (default tpu)."""
    state = load_file(filename, device=device)
    return model.load_state_dict(state, strict=strict)


class _Slice:
    def __init__(self, inner, device):
        self._inner, self._device = inner, device

    def __getitem__(self, index):
        return _move(self._inner[index], self._device)

    def __getattr__(self, name):            # get_shape, get_dtype, ...
        return getattr(self._inner, name)


class safe_open:
    """As safetensors.safe_open(filename, framework="pt", device=...), for any torch device.

    Reads each tensor on the CPU only when get_tensor / get_slice(...)[...] asks
    for it, then moves it to `device` with one transfer."""

    def __init__(self, filename, framework: str = "pt", device: Union[str, int, torch.device] = "tpu",
                 **kwargs):
        if framework not in ("pt", "torch"):
            raise ValueError(f"torch_pjrt.integrations.safetensors.safe_open: framework must be 'pt', got {framework!r}")
        self._device = _device(device)
        self._inner = _stock_safe_open(filename, framework="pt", device="cpu", **kwargs)

    def __enter__(self):
        self._inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)

    def get_tensor(self, name: str) -> torch.Tensor:
        return _move(self._inner.get_tensor(name), self._device)

    def get_tensors(self) -> Dict[str, torch.Tensor]:
        return {k: self.get_tensor(k) for k in self._inner.offset_keys()}

    def get_slice(self, name: str) -> _Slice:
        return _Slice(self._inner.get_slice(name), self._device)

    def keys(self):
        return self._inner.keys()

    def metadata(self) -> Optional[Dict[str, str]]:
        return self._inner.metadata()

    def __getattr__(self, name):            # offset_keys and whatever later versions add (reads no tensor)
        return getattr(self._inner, name)


def _is_tpu(device):
    if not isinstance(device, (str, torch.device)):
        return False                # an int: safetensors' own (the current accelerator)
    try:
        return torch.device(device).type == "tpu"
    except (RuntimeError, ValueError):
        return False                # safetensors' own error for a bad device string


def _safe_open_any_device(filename, framework, device="cpu", *args, **kwargs):
    if _is_tpu(device) and framework in ("pt", "torch") and not args:
        return safe_open(filename, framework=framework, device=device, **kwargs)
    return _stock_safe_open(filename, framework, device, *args, **kwargs)


_safe_open_any_device.__wrapped__ = _stock_safe_open
_safe_open_any_device.__doc__ = _stock_safe_open.__doc__
setattr(_safe_open_any_device, _MARK, True)


def patch_stock():
    """Stock safetensors' safe_open (so load_file and load_model) accepts tpu
    devices; also rebinds the name in modules that imported it already."""
    if getattr(safetensors.safe_open, _MARK, False):
        return
    this = sys.modules[__name__]
    for mod in list(sys.modules.values()):
        # (The module's own dict: getattr would make lazy modules, such as
        # transformers', import their submodules.)
        names = getattr(mod, "__dict__", None)
        if mod is this or not isinstance(names, dict) or names.get("safe_open") is not _stock_safe_open:
            continue
        try:
            mod.safe_open = _safe_open_any_device
        except (AttributeError, TypeError):
            pass
