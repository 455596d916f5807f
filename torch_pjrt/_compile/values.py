"""The values a graph walk deals in (shared by lower_graph.py and hops.py)."""
import torch

_META = torch.device("meta")


class Unsupported(Exception):
    """The graph holds an op the lowering registry cannot build; names the op."""

    def __init__(self, op, why):
        super().__init__(f"{op}: {why}")
        self.op = str(op)


class _Val:
    """A tensor value of the program: its id and PyTorch's meta tensor for it."""
    __slots__ = ("id", "meta", "input_index", "root", "chain")

    def __init__(self, id, meta, input_index=None, root=None, chain=()):
        self.id, self.meta, self.input_index = id, meta, input_index
        self.root = root    # views: the value whose storage they view
        self.chain = chain  # views: the view ops from root, to replay on another layout


def _type(t):
    return (t.dtype, list(t.shape))


def _dense_meta(v):
    """A contiguous meta tensor of `v`'s type (a region's values are logical arrays)."""
    m = v.meta if isinstance(v, _Val) else None
    if not isinstance(m, torch.Tensor):
        raise Unsupported("control flow", f"a subgraph value of type {type(v).__name__}")
    return torch.empty(m.shape, dtype=m.dtype, device=_META)
