"""torch.distributed on the tpu device: the c10d backend named "tpu".

``import torch_pjrt`` registers it, so ``torch.distributed.init_process_group(
backend="tpu")`` (or the mixed form ``"cpu:gloo,tpu:tpu"``) works under torchrun
and ``torch.multiprocessing.spawn``, and DDP, FSDP2 and DTensor find a backend
for tpu tensors.

Where the collectives run: the CPU PJRT plugin has no cross-process
collectives, so each collective stages its tpu tensors in host memory, runs
on gloo (made from the same store), and copies the results back when that
work completes (csrc/distributed/host_backend.cpp). Work handles are
asynchronous: ``wait()`` and the work's future both finish the copy back.
``torch_pjrt.metrics()`` counts this path: ``distributed_host_collectives``,
``distributed_to_host_bytes``, ``distributed_from_host_bytes``.

On-device collectives (csrc/distributed/device_backend.cpp): where the PJRT
client spans the job's processes, each collective is an XLA program
(stablehlo.all_reduce, all_gather, ...) on the rank's device. With the CUDA
plugin the client is made to span them at the first process group, through
PJRT's distributed options with this store as its key-value store, provided
no tpu tensor exists yet. ``TORCH_PJRT_DEVICE_COLLECTIVES``: ``auto``
(default: on-device where the client spans the processes), ``0`` (always the
host path), ``1`` (also try the CPU plugin; a one-rank group then runs
on-device). ``distributed_device_collectives`` in ``torch_pjrt.metrics()``
counts them. docs/distributed.md.
"""
import os
import warnings
from datetime import timedelta

import torch.distributed as dist

from .. import _state

BACKEND = "tpu"
# TorchTPU's name for its backend, which transformers' own initialization
# asks for on a "tpu" device (transformers/distributed/utils.py, backend_map):
# the same backend here, so code written for TorchTPU runs unchanged.
ALIASES = ("tpu_dist",)
_MODES = ("auto", "0", "1")


def _mode():
    mode = os.environ.get("TORCH_PJRT_DEVICE_COLLECTIVES", "auto").strip() or "auto"
    if mode not in _MODES:
        raise ValueError(f"torch_pjrt: TORCH_PJRT_DEVICE_COLLECTIVES must be one of {', '.join(_MODES)}, "
                         f"got {mode!r}")
    return mode


def spans_processes():
    """Whether the PJRT client's devices include other processes' (on-device
    collectives can run across them)."""
    return any(d["local"] < 0 for d in _state.C.global_devices())


def _device_path(store, rank, world_size):
    """Whether this group's collectives run as XLA programs on the device."""
    mode = _mode()
    if mode == "0":
        return False
    plugin = _state.C.plugin_info()["name"]
    made_at_import = _state.C.client_node()[1] == 1
    if world_size > 1 and made_at_import and not spans_processes() and (plugin == "cuda" or mode == "1"):
        # The job's first group: the client is made again as one node of the
        # job (node id = rank), finding the others through this store.
        try:
            _state.C.make_distributed_client(dist.PrefixStore("pjrt/", store), rank, world_size)
        except RuntimeError as err:
            warnings.warn(f"{err}; collectives on tpu tensors go through host copies and gloo", RuntimeWarning,
                          stacklevel=3)
            return False
    if spans_processes():
        return True
    if mode == "1" and world_size == 1:
        return True
    if mode == "1":
        warnings.warn(f"torch_pjrt: plugin {plugin!r} offers no collectives across processes (its client does not "
                      "span them); collectives on tpu tensors go through host copies and gloo", RuntimeWarning,
                      stacklevel=3)
    return False


def _create(store, rank, world_size, timeout):
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    # gloo under its own key prefix: a "cpu:gloo" backend of the same group
    # uses this store too.
    host = dist.ProcessGroupGloo(dist.PrefixStore("tpu_host/", store), rank, world_size, timeout)
    backend = _state.C.host_copy_backend(host)
    if _device_path(store, rank, world_size):
        # What has no program (gather, scatter, uneven all_to_all, CPU
        # tensors) still takes the host path.
        backend = _state.C.device_backend(dist.PrefixStore("tpu_device/", store), rank, world_size, backend,
                                          int(timeout.total_seconds() * 1000))
    return backend


def register():
    """Registers the "tpu" c10d backend (idempotent); for tpu tensors, and for
    CPU tensors (passed through to gloo) when it is the group's only backend.
    "tpu" comes first: the first name registered for a device is its default."""
    if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, devices=["tpu", "cpu"])
    for alias in ALIASES:
        if alias.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(alias, _create, devices=["tpu", "cpu"])
