"""PyTorch's legacy serialization (pickle.dumps of a tensor or storage,
torch.save(..., _use_new_zipfile_serialization=False) and its torch.load) on
tpu storages.

It writes and reads a storage's bytes with `StorageBase._write_file` and
`_set_from_file`, which for any device but CPU go through at::from_blob at
the storage's data pointer; a tpu data pointer is an opaque handle (the
values are in PJRT buffers), so both raised. A tpu storage writes its CPU
copy's bytes and reads into a CPU storage it then copies from; the location
tag ("tpu:0") is recorded apart, so loading puts it back on tpu."""
import functools

import torch


def _tpu_through_cpu(name, method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.device.type != "tpu":
            return method(self, *args, **kwargs)
        if name == "_write_file":
            return method(self.cpu(), *args, **kwargs)
        host = torch.UntypedStorage(self.nbytes())
        result = method(host, *args, **kwargs)
        self.copy_(host)
        return self if result is host else result
    wrapper._torch_pjrt_tpu_through_cpu = True
    return wrapper


def install():
    """Wraps torch.UntypedStorage._write_file and _set_from_file (idempotent)."""
    for name in ("_write_file", "_set_from_file"):
        method = getattr(torch.UntypedStorage, name)
        if not getattr(method, "_torch_pjrt_tpu_through_cpu", False):
            setattr(torch.UntypedStorage, name, _tpu_through_cpu(name, method))
