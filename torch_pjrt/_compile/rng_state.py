"""Activation checkpointing's random state on tpu. Under torch.compile, a
random op in a checkpointed region runs in the forward graph as
`run_and_save_rng_state(op, ...)` and again in the backward graph as
`run_with_rng_state(state, op, ...)`, which must draw the same numbers.
PyTorch implements these for CPU, CUDA, HPU and XPU only.

On tpu the state is the op's 128-bit key as an s64[2] tensor: compiled
graphs lower both ops with that key as a program value (lower_graph.py), and
these eager implementations (graphs run in pieces or op by op) force the
same key on the op, so either side can meet the other."""
import contextlib

import torch
from torch._C import DispatchKey

from .. import _state


def _tpu_index(args, kwargs):
    # A tpu tensor argument, or a factory's device= (torch.randperm(n, device="tpu")).
    for t in torch.utils._pytree.tree_flatten((args, kwargs))[0]:
        if isinstance(t, torch.Tensor) and t.device.type == "tpu":
            return t.device.index or 0
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "tpu":
        return torch.device(device).index or 0
    return None


@contextlib.contextmanager
def _forced(key):
    # (Ops that run through the CPU fallback, poisson, rrelu's
    # noise, draw from a CPU generator seeded from the forced key then.)
    _state.C.force_rng_key(key)
    try:
        yield
    finally:
        _state.C.force_rng_key(None)


def _save(op, *args, **kwargs):
    device = _tpu_index(args, kwargs)
    key = _state.C.draw_rng_key(device)
    with _forced(key):
        out = op(*args, **kwargs)
    return torch.tensor(key, dtype=torch.int64, device=torch.device("tpu", device)), out


def _run_with(state, op, *args, **kwargs):
    if state.dtype != torch.int64 or state.shape != (2,):
        raise RuntimeError(f"torch_pjrt: run_with_rng_state on tpu takes the s64[2] key run_and_save_rng_state "
                           f"saved, got a {state.dtype} tensor of shape {list(state.shape)}")
    with _forced(tuple(state.tolist())):
        return op(*args, **kwargs)


def install():
    from torch._prims import rng_prims
    for hop, tpu_impl in ((rng_prims.run_and_save_rng_state, _save),
                          (rng_prims.run_with_rng_state, _run_with)):
        select = hop.py_kernels.get(DispatchKey.BackendSelect)
        if select is None or getattr(select, "_torch_pjrt", False):
            continue

        def backend_select(*args, _tpu=tpu_impl, _other=select, **kwargs):
            # (PyTorch's own picks an implementation by device from a fixed table.)
            if _tpu_index(args, kwargs) is not None:
                return _tpu(*args, **kwargs)
            return _other(*args, **kwargs)
        backend_select._torch_pjrt = True
        hop.py_kernels[DispatchKey.BackendSelect] = backend_select
        if DispatchKey.PrivateUse1 not in hop.py_kernels:
            hop.py_impl(DispatchKey.PrivateUse1)(tpu_impl)
        hop._dispatch_cache.clear()
