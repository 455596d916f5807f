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
    __slots__ = ("id", "meta", "input_index", "root", "chain", "shifted")

    def __init__(self, id, meta, input_index=None, root=None, chain=(), shifted=frozenset()):
        self.id, self.meta, self.input_index = id, meta, input_index
        self.root = root    # views: the value whose storage they view
        self.chain = chain  # views: the view ops from root, to replay on another layout
        # views: the inputs (runtime ints) whose values move it at run time;
        # its meta's offset is this call's (x[n] for this n), and its chain
        # holds the _Ints (a returned one is made by replaying the chain).
        self.shifted = shifted


def _type(t):
    return (t.dtype, list(t.shape))


def _dense_meta(v):
    """A contiguous meta tensor of `v`'s type (a region's values are logical arrays)."""
    m = v.meta if isinstance(v, _Val) else None
    if not isinstance(m, torch.Tensor):
        raise Unsupported("control flow", f"a subgraph value of type {type(v).__name__}")
    return torch.empty(m.shape, dtype=m.dtype, device=_META)


class _Int(int):
    """A Python int of the graph (a SymInt input, or arithmetic on one) that
    the program takes at run time: this call's value, plus `vid`, the 0-d s64
    value holding it in the program, `origins`, the positions of the graph
    inputs it comes from, and `host`, how a call's arguments give its value
    (a view at its offset is returned as one: the host makes that view)."""

    def __new__(cls, value, vid, origins, host):
        self = super().__new__(cls, value)
        self.vid, self.origins = vid, frozenset(origins)
        self.host = host  # args -> its value for a call's graph arguments
        return self


class NeedsValue(Exception):
    """An op reads the value of a runtime int (_Int) where the program cannot
    take it at run time: those inputs' values key the program instead."""

    def __init__(self, origins, why):
        super().__init__(why)
        self.origins = frozenset(origins)


def int_origins(values):
    """The origins of the runtime ints among `values` (nested lists, dicts)."""
    from torch.utils._pytree import tree_flatten
    out = set()
    for v in tree_flatten(values)[0]:
        if isinstance(v, _Int):
            out |= v.origins
    return out
