"""Data parallel over N chips: the batch of each data input split along its
first dimension, everything else (parameters, gradients, optimizer state,
random keys, host scalars) replicated, written as mhlo.sharding attributes
on the program's parameters, for XLA's SPMD partitioner. Program parameters
are flat storages (row-major), so splitting one into N contiguous pieces is
splitting its tensor's first dimension."""
import re

_SIGNATURE = re.compile(r"func\.func public @main\((.*?)\) ->", re.S)
_ARG = re.compile(r"(%arg\d+): (tensor<[^>]*>)")


def split_arg(numel, chips):
    return numel % chips == 0 and numel >= chips


def annotate(text, split, chips):
    """`text` with a sharding on every main parameter: `split[i]` True ->
    its elements split in `chips` pieces, else replicated."""
    match = _SIGNATURE.search(text)
    if not match:
        raise ValueError("torch_pjrt: readiness: no main function in the program")
    args = _ARG.findall(match.group(1))
    if len(args) != len(split):
        raise ValueError(f"torch_pjrt: readiness: {len(args)} program parameters, {len(split)} shardings")
    pieces = []
    for (name, ty), s in zip(args, split):
        sharding = f"{{devices=[{chips}]<=[{chips}]}}" if s else "{replicated}"
        pieces.append(f'{name}: {ty} {{mhlo.sharding = "{sharding}"}}')
    return text[:match.start(1)] + ", ".join(pieces) + text[match.end(1):]


def numel_of(tensor_type):
    """Elements of "tensor<8x16xf32>" (a rank-0 tensor has one)."""
    dims = tensor_type[len("tensor<"):-1].split("x")[:-1]
    n = 1
    for d in dims:
        n *= int(d)
    return n


def param_types(text):
    match = _SIGNATURE.search(text)
    return [ty for _, ty in _ARG.findall(match.group(1))] if match else []
