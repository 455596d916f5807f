"""Capturing the programs torch.compile(backend="tpu") builds, without running
them (a dry run): each compiled graph is lowered to its StableHLO module and
recorded; its outputs come back as tensors of the right shapes whose storage
is never written (so nothing is allocated or computed on the device). The
readiness check (torch_pjrt/readiness) compiles the recorded modules for a
TPU topology; nothing else changes."""
import contextlib
import dataclasses
from typing import List, Optional

import torch

_ACTIVE: Optional["Capture"] = None


@dataclasses.dataclass
class Program:
    name: str            # the graph's name, e.g. "forward0"
    phase: str           # what the caller was doing: "forward", "backward", "optimizer step", ...
    text: str            # the StableHLO module
    params: list         # per program parameter: (kind, graph input index or -1)
    inputs: list         # per graph input: the tensor's (shape, dtype, storage key) or None
    outputs: list        # (dtype, sizes) of the program's outputs


class Capture:
    def __init__(self):
        self.programs: List[Program] = []
        self.phase = "step"  # set by the caller around each part of its step

    def record(self, name, lowered, args):
        inputs = []
        for a in args:
            if isinstance(a, torch.Tensor):
                key = a.untyped_storage().data_ptr() if a.device.type == "tpu" else None
                inputs.append((tuple(a.shape), a.dtype, key))
            else:
                inputs.append(None)
        self.programs.append(Program(name, self.phase, lowered.text, list(lowered.prog.param_sources()), inputs,
                                     [(o[0], o[1]) for o in lowered.outputs]))


def active():
    return _ACTIVE


@contextlib.contextmanager
def capture():
    """Within: compiled graphs are recorded, not run (see the module docstring)."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, Capture()
    try:
        yield _ACTIVE
    finally:
        _ACTIVE = previous


def placeholder_outputs(lowered):
    """Never-written tensors for a lowered graph's outputs (its host outputs on the CPU)."""
    outs = []
    for dtype, sizes, strides, on_cpu, _ in lowered.outputs:
        device = "cpu" if on_cpu else "tpu"
        if strides:
            outs.append(torch.empty_strided(sizes, strides, dtype=dtype, device=device))
        else:
            outs.append(torch.empty(sizes, dtype=dtype, device=device))
    return outs
