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
import numbers
import operator

import torch
from torch.utils._pytree import tree_map

__all__ = ["bucketed", "next_bucket"]


def next_bucket(length, sizes):
    """The smallest bucket size >= length (length itself when it exceeds all)."""
    sizes = sorted(sizes)
    i = bisect.bisect_left(sizes, length)
    return sizes[i] if i < len(sizes) else length


def _argument_names(signature):
    """The parameters an argument can be padded in: named ones, not *args/**kwargs."""
    return [n for n, p in signature.parameters.items()
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def _name_of(option, key, names, signature):
    """The parameter `key` (a name, or a position among the positional parameters) stands for."""
    if isinstance(key, str):
        if key not in names:
            raise ValueError(f"torch_pjrt.bucketed: {option} names {key!r}, not among the arguments "
                             f"{list(signature.parameters)}")
        return key
    if isinstance(key, bool) or not isinstance(key, int):
        raise TypeError(f"torch_pjrt.bucketed: {option} keys must be argument names or positions, got {key!r}")
    positional = [n for n in names if signature.parameters[n].kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if not 0 <= key < len(positional):
        raise ValueError(f"torch_pjrt.bucketed: {option} names position {key}, but the function takes "
                         f"{len(positional)} positional argument(s) {positional}")
    return positional[key]


def _integer(option, value):
    """An int (or an integer-like such as numpy's; not a bool or a float)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"torch_pjrt.bucketed: {option} must be an int, got {value!r}") from None


def bucketed(fn, dims, sizes, pad_values=None, output_dim=None, device=None):
    """Wraps `fn`: for each argument named (or numbered) in `dims`, its
    dimension dims[name] is padded up to next_bucket(length, sizes) with
    pad_values.get(name, 0), then moved to `device` if given. Tensor outputs
    whose `output_dim` (default: the first of dims' values) has the padded
    length are narrowed back."""
    if not callable(fn):
        raise TypeError(f"torch_pjrt.bucketed: fn must be callable, got {type(fn).__name__}")
    # A module's (or torch.compile'd module's) arguments are its forward's.
    target = getattr(fn, "_orig_mod", fn)
    signature = inspect.signature(target.forward if isinstance(target, torch.nn.Module) else target)
    # Everything is checked here, once: a mistake would otherwise surface at
    # the first call, deep in torch.full or as an IndexError (or not at all).
    if not isinstance(dims, dict):
        raise TypeError(f"torch_pjrt.bucketed: dims must be a dict {{argument name or position: dimension}}, "
                        f"got {dims!r}")
    if not dims:
        raise ValueError("torch_pjrt.bucketed: `dims` names no argument to pad")
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise TypeError(f"torch_pjrt.bucketed: sizes must be a list of positive ints, got {sizes!r}")
    sizes = [_integer(f"sizes[{i}]", s) for i, s in enumerate(sizes)]
    if not sizes:
        raise ValueError("torch_pjrt.bucketed: sizes is empty: give the bucket sizes, e.g. [64, 128, 256]")
    if any(s <= 0 for s in sizes):
        raise ValueError(f"torch_pjrt.bucketed: bucket sizes must be positive, got {sizes}")
    names = _argument_names(signature)
    # Positions become names now: bound.arguments holds only the arguments
    # given, so a position counted there would shift past an omitted default.
    resolved = {_name_of("dims", k, names, signature): _integer(f"dims[{k!r}]", d) for k, d in dims.items()}
    if len(resolved) != len(dims):
        raise ValueError(f"torch_pjrt.bucketed: dims names one argument twice (by name and position): {dims}")
    dims = resolved
    if pad_values is not None and not isinstance(pad_values, dict):
        raise TypeError(f"torch_pjrt.bucketed: pad_values must be a dict {{argument name or position: value}}, "
                        f"got {pad_values!r}")
    padded = {}
    for k, v in (pad_values or {}).items():
        name = _name_of("pad_values", k, names, signature)
        if name not in dims:
            raise ValueError(f"torch_pjrt.bucketed: pad_values names {k!r}, which dims does not pad "
                             f"(dims: {list(dims)})")
        if not isinstance(v, numbers.Number):  # torch.full's fill value (False pads a bool mask)
            raise TypeError(f"torch_pjrt.bucketed: pad_values[{k!r}] must be a number, got {v!r}")
        padded[name] = v
    pad_values = padded
    if output_dim is not None:
        output_dim = _integer("output_dim", output_dim)
    out_dim = next(iter(dims.values())) if output_dim is None else output_dim

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        length = None
        for name, dim in dims.items():
            if name not in bound.arguments:
                continue
            t = bound.arguments[name]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"torch_pjrt.bucketed: argument '{name}' is {type(t).__name__}, not a tensor")
            if not -t.dim() <= dim < t.dim():
                raise ValueError(f"torch_pjrt.bucketed: dims pads dimension {dim} of argument '{name}', "
                                 f"which has {t.dim()} dimension(s)")
            n = t.shape[dim]
            if length is not None and n != length:
                raise ValueError(f"torch_pjrt.bucketed: argument '{name}' has length {n} in dim {dim}, "
                                 f"others have {length}")
            length = n
        if length is None:
            return fn(*args, **kwargs)
        target = next_bucket(length, sizes)
        for name, dim in dims.items():
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
