"""tpu tensors and storages sent to another process by torch.multiprocessing
(Queue.put, Process/spawn arguments, DataLoader workers' batches).

torch.multiprocessing pickles a CUDA tensor as an IPC handle and any other
device's storage through CPU shared memory (`_share_fd_cpu_`), which raised
"_share_fd_: only available on CPU" for tpu. That error is raised in a
Queue's feeder thread, so put() returned, the receiver waited forever and a
DataLoader with workers hung. PJRT buffers have no inter-process handle, so a
tpu tensor is sent as a copy: its bytes travel inside the pickle (no shared
memory file whose descriptor must outlive the send, as a spawned Process's
arguments would need) and the receiver puts them on the same tpu device.
Writes in one process are then not seen by the other (CUDA's IPC would share
them); the first send in a process says so once (not in DataLoader workers,
whose batches are new tensors)."""
import warnings

import torch
from torch.multiprocessing import reductions as _torch_reductions

_warned = False


def _warn_copy():
    global _warned
    # A DataLoader worker's batches are new tensors nobody shares: no warning there.
    if not _warned and torch.utils.data.get_worker_info() is None:
        _warned = True
        warnings.warn(
            "torch_pjrt: a tpu tensor sent to another process (torch.multiprocessing) is copied: PJRT "
            "device buffers cannot be shared between processes, so writes in one process are not seen by "
            "the other (CUDA tensors are shared by IPC).", stacklevel=3)


def _to_bytes(host):
    return host.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _from_bytes(data, dtype, shape):
    if not data:
        return torch.empty(shape, dtype=dtype, device="cpu")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def rebuild_tpu_tensor(cls, data, dtype, shape, device, requires_grad):
    t = _from_bytes(data, dtype, shape).to(device)
    if cls is torch.nn.parameter.Parameter:
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t


def rebuild_tpu_storage(data, device):
    return _from_bytes(data, torch.uint8, (len(data),)).untyped_storage().to(device=device)


def _reduce_tensor(original):
    def reduce_tensor(tensor):
        if tensor.device.type != "tpu" or tensor.is_nested or tensor.layout != torch.strided:
            return original(tensor)
        if tensor.requires_grad and not tensor.is_leaf:
            return original(tensor)  # torch's "Cowardly refusing to serialize non-leaf tensor" error
        _warn_copy()
        host = tensor.detach().cpu()
        return (rebuild_tpu_tensor, (type(tensor), _to_bytes(host), host.dtype, tuple(host.shape),
                                     tensor.device, tensor.requires_grad))
    reduce_tensor._torch_pjrt_tpu_copy = True
    return reduce_tensor


def _reduce_storage(original):
    def reduce_storage(storage):
        if storage.device.type != "tpu":
            return original(storage)
        _warn_copy()
        host = torch.empty(0, dtype=torch.uint8, device="cpu").set_(storage.cpu())
        return (rebuild_tpu_storage, (_to_bytes(host), storage.device))
    reduce_storage._torch_pjrt_tpu_copy = True
    return reduce_storage


def install():
    """Registers tpu-aware reducers with torch.multiprocessing's pickler (idempotent). Each
    wraps torch's own reducer for its type, which keeps every other device's path."""
    from multiprocessing.reduction import ForkingPickler

    reducers = ForkingPickler._extra_reducers
    for cls in [torch.Tensor, torch.nn.parameter.Parameter, *torch._tensor_classes]:
        current = reducers.get(cls, _torch_reductions.reduce_tensor)
        if not getattr(current, "_torch_pjrt_tpu_copy", False):
            ForkingPickler.register(cls, _reduce_tensor(current))
    current = reducers.get(torch.UntypedStorage)
    if current is not None and not getattr(current, "_torch_pjrt_tpu_copy", False):
        ForkingPickler.register(torch.UntypedStorage, _reduce_storage(current))
