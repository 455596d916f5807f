"""Shape bucketing for compiled sequence models.

XLA compiles for static shapes: a model called with 100 sequence lengths
would compile 100 programs. `bucketed(fn, dims={"idx": 1}, sizes=[32, 64, 128])`
pads the named dimension of the named arguments up to the next bucket size and
slices the outputs back, so at most len(sizes) programs are compiled. Padding
goes at the end, so it is exact for causal models (position t never sees
t' > t) and for per-position outputs; a loss must ignore padded positions
(pad its targets with the loss's ignore_index through `pad_values`).

Inputs that come from the host (token ids from a data loader) are best padded
there: with `device="tpu"` the padded arguments are moved to the device after
padding, so nothing on the device ever has a per-length shape and no program
at all is compiled per length. Arguments already on the device are padded by
a small eager program per length (a few ms to compile, once per length).
"""
import bisect
import functools
import inspect

import torch
from torch.utils._pytree import tree_map

__all__ = ["bucketed", "next_bucket"]


def next_bucket(length, sizes):
    """The smallest bucket size >= length (length itself when it exceeds all)."""
    sizes = sorted(sizes)
    i = bisect.bisect_left(sizes, length)
    return sizes[i] if i < len(sizes) else length


def bucketed(fn, dims, sizes, pad_values=None, output_dim=None, device=None):
    """Wraps `fn`: for each argument named (or numbered) in `dims`, its
    dimension dims[name] is padded up to next_bucket(length, sizes) with
    pad_values.get(name, 0), then moved to `device` if given. Tensor outputs
    whose `output_dim` (default: the first of dims' values) has the padded
    length are narrowed back."""
    if not dims:
        raise ValueError("torch_pjrt.bucketed: `dims` names no argument to pad")
    if not sizes or any(int(s) <= 0 for s in sizes):
        raise ValueError(f"torch_pjrt.bucketed: bucket sizes must be positive, got {sizes}")
    pad_values = dict(pad_values or {})
    out_dim = next(iter(dims.values())) if output_dim is None else output_dim
    # A module's (or torch.compile'd module's) arguments are its forward's.
    target = getattr(fn, "_orig_mod", fn)
    signature = inspect.signature(target.forward if isinstance(target, torch.nn.Module) else target)
    unknown = [k for k in dims if isinstance(k, str) and k not in signature.parameters]
    if unknown:
        raise ValueError(f"torch_pjrt.bucketed: {unknown} not among the arguments {list(signature.parameters)}")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        params = list(bound.arguments)
        length = None
        for key, dim in dims.items():
            name = params[key] if isinstance(key, int) else key
            if name not in bound.arguments:
                continue
            t = bound.arguments[name]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"torch_pjrt.bucketed: argument '{name}' is {type(t).__name__}, not a tensor")
            n = t.shape[dim]
            if length is not None and n != length:
                raise ValueError(f"torch_pjrt.bucketed: argument '{name}' has length {n} in dim {dim}, "
                                 f"others have {length}")
            length = n
        if length is None:
            return fn(*args, **kwargs)
        target = next_bucket(length, sizes)
        for key, dim in dims.items():
            name = params[key] if isinstance(key, int) else key
            if name not in bound.arguments:
                continue
            t = bound.arguments[name]
            if target != length:
                shape = list(t.shape)
                shape[dim] = target - length
                fill = torch.full(shape, pad_values.get(name, 0), dtype=t.dtype, device=t.device)
                t = torch.cat([t, fill], dim=dim)
            bound.arguments[name] = t if device is None else t.to(device)
        out = fn(*bound.args, **bound.kwargs)
        if target == length:
            return out

        def narrow(t):
            if isinstance(t, torch.Tensor) and t.dim() > out_dim and t.shape[out_dim] == target:
                return t.narrow(out_dim, 0, length)
            return t
        return tree_map(narrow, out)

    wrapper.bucket_sizes = sorted(sizes)
    return wrapper
