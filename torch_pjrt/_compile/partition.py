"""A graph with ops the registry cannot build: PyTorch's capability-based
partitioner cuts it into the largest pieces that can be lowered; each piece
becomes its own CompiledGraphFn (one program per signature), and the rest of
the graph (the unsupported ops) runs op by op between them."""
import copy
import operator

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from .lower_graph import decomposition, is_view, mutates, registry_lowering


def _lowerable(op):
    schema = op._schema
    if schema.name == "aten::copy_":
        return False  # input writes stay with the eager part
    if is_view(schema):
        return True
    if mutates(schema):
        return False
    return registry_lowering(schema) is not None or decomposition(op) is not None


class _Support(OperatorSupportBase):
    def is_node_supported(self, submodules, node):
        if node.op != "call_function":
            return False
        if isinstance(node.target, torch._ops.OpOverload):
            return _lowerable(node.target)
        return node.target is operator.getitem


class _Piece(torch.nn.Module):
    """Calls a CompiledGraphFn from the partitioned parent graph."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        out = self.fn(list(args))
        return out[0] if self.single else tuple(out)


def partition(gm, name, make_fn):
    """The partitioned module, or None when no piece can be lowered.
    `make_fn(submodule, piece_name)` builds the CompiledGraphFn of a piece."""
    gm = copy.deepcopy(gm)
    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    pieces = partitioner.propose_partitions()
    if not pieces:
        return None
    fused = partitioner.fuse_partitions(pieces, prefix="piece_")
    for node in fused.graph.nodes:
        if node.op != "call_module":
            continue
        sub = getattr(fused, node.target)
        out = list(sub.graph.nodes)[-1]
        single = not isinstance(out.args[0], (tuple, list))
        if single:  # the lowering returns a tuple: the parent wants the value
            out.args = ((out.args[0],),)
            sub.recompile()
        piece = _Piece(make_fn(sub, f"{name}.{node.target}"))
        piece.single = single
        setattr(fused, node.target, piece)
    fused.recompile()
    return fused
