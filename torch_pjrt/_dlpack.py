"""DLPack export of tpu tensors is refused with a BufferError at the export.

PyTorch labels a PrivateUse1 tensor's capsule kDLExtDev and puts its storage's
data pointer in it; on tpu that pointer is an opaque handle (the values are in
PJRT device buffers), so a consumer would be handed memory that is not there,
and torch.from_dlpack of it gave a tensor failing at first use. PyTorch refuses
devices it cannot share the same way (meta: "Cannot pack tensors on meta")."""
import functools

import torch


def _refusing(export):
    @functools.wraps(export)
    def wrapper(tensor, *args, **kwargs):
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "tpu":
            raise BufferError(
                f"torch_pjrt: cannot export a tensor on {tensor.device} through DLPack: its values are in "
                "PJRT device buffers, not addressable memory; copy it to the host first (tensor.cpu())")
        return export(tensor, *args, **kwargs)
    wrapper._torch_pjrt_refuses_tpu = True
    return wrapper


def install():
    """Wraps the exporters Tensor.__dlpack__ and torch.utils.dlpack.to_dlpack call (idempotent)."""
    import torch.utils.dlpack as dlpack
    # __dlpack_device__ is what torch.from_dlpack asks first; it knew no "tpu"
    # (a ValueError "Unknown device type tpu for Dlpack").
    for owner, name in ((torch._C, "_to_dlpack"), (torch._C, "_to_dlpack_versioned"), (dlpack, "to_dlpack"),
                        (torch.Tensor, "__dlpack_device__")):
        fn = getattr(owner, name, None)
        if fn is not None and not getattr(fn, "_torch_pjrt_refuses_tpu", False):
            setattr(owner, name, _refusing(fn))
