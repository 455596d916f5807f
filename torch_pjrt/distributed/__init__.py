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
``distributed_to_host_bytes``, ``distributed_from_host_bytes``. The on-device
path (XLA collectives through PJRT's distributed client, for the CUDA and TPU
plugins) is not built yet: docs/distributed.md.
"""
from datetime import timedelta

import torch.distributed as dist

from .. import _state

BACKEND = "tpu"


def _create(store, rank, world_size, timeout):
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    # gloo under its own key prefix: a "cpu:gloo" backend of the same group
    # uses this store too.
    host = dist.ProcessGroupGloo(dist.PrefixStore("tpu_host/", store), rank, world_size, timeout)
    return _state.C.host_copy_backend(host)


def register():
    """Registers the "tpu" c10d backend (idempotent); for tpu tensors, and for
    CPU tensors (passed through to gloo) when it is the group's only backend."""
    if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, devices=["tpu", "cpu"])
