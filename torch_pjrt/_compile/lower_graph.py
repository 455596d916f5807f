"""One FX graph (ATen ops, as AOTAutograd hands it over) -> one StableHLO module.

The graph is walked with concrete input shapes: each node's op runs on meta
tensors (PyTorch's own shape/dtype inference, SymInts already resolved to this
call's ints) and is lowered by the C++ lowering registry, the same one eager
uses. Views become reads of the base's layout; `_foreach_` ops run their
element lowering per list index; an op without a lowering but with a PyTorch
decomposition is traced into ATen ops and walked in turn.
"""
import operator

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .. import _state
from .hops import _LOWERED_HOPS, HigherOrderOps
from .values import _META, NeedsValue, Unsupported, _Int, _type, _Val, int_origins  # noqa: F401 (graph_fn's imports)


def _device_group_ids(group_name, device):
    """Global device ids of the group's ranks when its tpu backend runs
    collectives on the device (None otherwise); `device`: this rank's tpu index."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group
    try:
        backend = _resolve_process_group(group_name)._get_backend(torch.device("tpu"))
    except (RuntimeError, ValueError, KeyError):
        return None
    return _state.C.device_backend_ids(backend, device)


class Lowered:
    """The program text plus what the runner needs to feed and unpack it."""

    def __init__(self, prog, text, outputs, output_template, mutations, host, device, replica_ids=()):
        self.prog, self.text = prog, text
        self.replica_ids = list(replica_ids)      # collectives: global device id of each group rank
        self.device = device                     # tpu index, when no input says it
        self.host = host                         # HostPart or None
        self.outputs = outputs                   # [(dtype, sizes, strides, on_cpu, program_output)]
        self.output_template = output_template   # graph outputs: ("t", k), ("v", k, view), ("h", k), ("c", constant),
        #                                          ("n", host fn), ("r", "i"/"o", k, view chain): runtime ints (graph_fn._unpack)
        self.mutations = mutations               # [(input index, program output)]
        self.runtime_ints = ()                   # int args read at run time (int_pack)


_INDEX_PUTS = ("index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put")


def _mask_among_indices(indices):
    """Whether an index list mixes a bool/uint8 mask with other index tensors
    (index_put's lowering takes a lone mask as it is)."""
    given = [t for t in indices or () if isinstance(t, _Val)]
    return len(given) > 1 and any(t.meta.dtype in (torch.bool, torch.uint8) for t in given)


# Scatters into a view, by the view they write.
_VIEW_SCATTERS = {"diagonal_scatter": torch.diagonal,
                  "as_strided_scatter": lambda t, *a, **k: t.as_strided(*a, **k)}
# Lazy conjugate/negative views and the ops that compute what they read as.
_LAZY_BITS = {"_conj": torch.ops.aten._conj_physical.default, "_neg_view": torch.ops.aten.neg.default}


def is_view(schema):
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def mutates(schema):
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def registry_lowering(schema):
    """(name, overload, per_element) of the registry lowering that builds
    this op: its own, or for a _foreach_ op its element op's; None if none."""
    name, overload = schema.name.split("::")[1], schema.overload_name
    if _state.C.find_lowering(name, overload) is not None:
        return name, overload, False
    elem = name[9:].rstrip("_")
    if name.startswith("_foreach_") and _state.C.find_lowering(elem, overload) is not None:
        return elem, overload, True
    return None


def decomposition(op):
    """PyTorch's decomposition of `op`, or None. A composite op can reach a
    graph after AOTAutograd's own decomposition (its pass turning Python
    floats into tensors writes true_divide): its composite kernel then."""
    from torch._decomp import decomposition_table

    from .random_decomps import TABLE
    fn = TABLE.get(op) or decomposition_table.get(op)
    if fn is None and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        fn = op.decompose
    return fn


def _attr(module, target):
    """A get_attr node's object (None where there is none)."""
    for name in target.split("."):
        module = getattr(module, name, None)
    return module


def any_downstream(node, pred):
    """Whether `pred` holds for a node that reads `node`, directly or through
    others (the graph's output node aside)."""
    stack, seen = list(node.users), set()
    while stack:
        u = stack.pop()
        if u in seen or u.op == "output":
            continue
        if pred(u):
            return True
        seen.add(u)
        stack.extend(u.users)
    return False


_AS_STRIDED = {"as_strided", "as_strided_copy", "as_strided_scatter", "as_strided_"}


def _may_read_beyond(placeholder):
    """Whether an op reading `placeholder` may read its storage beyond the
    view: an as_strided, or a higher-order op (its subgraph may hold one);
    True where its fake is unknown."""
    if not isinstance(placeholder.meta.get("val"), torch.Tensor):
        return True
    return any_downstream(placeholder, lambda u: isinstance(u.target, torch._ops.HigherOrderOperator) or
                          getattr(getattr(u.target, "_schema", None), "name", "").split("::")[-1] in _AS_STRIDED)


def _strided(t):
    return (list(t.shape), list(t.stride()), t.storage_offset())


def _custom_op_impl(op):
    """The Python implementation a torch.library.custom_op has for tpu (its
    tpu kernel, else its every-device one), or None."""
    if op.namespace in ("aten", "prims"):
        return None
    from torch._library.custom_ops import _maybe_get_opdef
    opdef = _maybe_get_opdef(op)
    fns = opdef._backend_fns if opdef is not None else {}
    return fns.get("tpu") or fns.get("privateuseone") or fns.get(None)


class _Inline(torch._ops.OpOverload):
    """A custom op whose calls run its Python implementation (traced inline);
    anything else (its schema) is the op's. (An OpOverload for the dense
    implementation's isinstance checks; OpOverload's own state is not set.)"""

    def __init__(self, op, impl):  # noqa: super().__init__ not called on purpose
        self._op, self._impl = op, impl

    def __getattr__(self, name):
        return getattr(self._op, name)

    def __call__(self, *args, **kwargs):
        return self._impl(*args, **kwargs)


def _view_of_copy(op):
    """The view op `op` (aten.X_copy, as functionalization writes views
    inside control-flow subgraphs) copies, or None."""
    packet = getattr(torch.ops.aten, op._schema.name.split("::")[1][:-len("_copy")], None)
    view = getattr(packet, op._schema.overload_name or "default", None) if packet is not None else None
    return view if view is not None and is_view(view._schema) else None


def _is_dense(t):
    """Non-overlapping and dense: a permutation of a contiguous layout."""
    return _state.C.dense_permutation(list(t.shape), list(t.stride())) is not None


class _Walker(HigherOrderOps):
    def __init__(self):
        self.C = _state.C
        self.prog = self.C.GraphProgram()
        self.mutations = {}    # input index -> value id
        self.written = {}      # value id -> input index its value was copied into, last
        self.fakes = {}        # value id -> the fake tensor PyTorch traced for it (top graph)
        self.replica_ids = []  # set by the graph's collectives (one group per graph)
        self.device = None     # the tpu index the graph runs on (collectives need it)
        self.loop_depth = 0    # inside while_loop / scan bodies (random ops are not lowered there)
        self.forced_rng = None  # the key value random ops take (run_with_rng_state), else their own
        self.inputs_by_id = {}  # id(tensor) -> its input value (subgraph constants lifted to inputs)
        self.rng_states = set()  # value ids of checkpointing's saved random states (kept on the device)

    # ---- argument packing (schema order, as the registry expects) ----
    def pack(self, schema, args, kwargs):
        packed = []
        for i, a in enumerate(schema.arguments):
            if i < len(args) and not a.kwarg_only:
                v = args[i]
            elif a.name in kwargs:
                v = kwargs[a.name]
            elif a.has_default_value():
                v = a.default_value
            else:
                v = None
            packed.append(self.pack_one(a, v))
        return packed

    def pack_one(self, a, v):
        name, t = a.name, str(a.type)
        if v is None:
            return (name, "none", None)
        if isinstance(v, _Int):  # a runtime int: read from the program's input
            return (name, "dwn" if t.startswith("Tensor") else "di", (int(v), v.vid))
        if isinstance(v, _Val):  # "tn": not contiguous (a few lowerings follow CPU's layout choice)
            meta = v.meta
            contiguous = not isinstance(meta, torch.Tensor) or meta.is_contiguous()
            return (name, "t" if contiguous else "tn", v.id)
        if isinstance(v, (list, tuple)):
            if any(isinstance(e, _Int) for e in v):
                raise NeedsValue(int_origins(v), f"argument '{name}': a list holding an int input")
            if any(isinstance(e, _Val) for e in v) or t.startswith("Tensor") or t.startswith("List[Tensor"):
                if "Optional[Tensor]" in t or "Tensor?" in t:
                    return (name, "otl", [None if e is None else e.id for e in v])
                return (name, "tl", [e.id for e in v])
            if all(isinstance(e, bool) for e in v):
                return (name, "il", [int(e) for e in v])
            if all(isinstance(e, int) for e in v):
                return (name, "il", list(v))
            return (name, "fl", [float(e) for e in v])
        if isinstance(v, torch.dtype):
            return (name, "dt", v)
        if isinstance(v, bool):
            return (name, "b", v)
        if isinstance(v, (int, float)):
            if t.startswith("Tensor"):
                return (name, "wn", v)
            return (name, "i" if isinstance(v, int) else "f", v)
        if isinstance(v, complex):  # read as a wrapped 0-d tensor, a Tensor or a Scalar argument
            return (name, "cn", (v.real, v.imag))
        if isinstance(v, str):
            return (name, "s", v)
        return (name, "other", None)  # device, layout, memory_format, generator

    # ---- node kinds ----
    def call_op(self, op, args, kwargs):
        schema = op._schema
        name = schema.name.split("::")[1]
        overload = schema.overload_name
        if schema.name.startswith("_c10d_functional::"):
            return self.collective(op, name, args)
        if not schema.returns and not mutates(schema):
            # Assertions. PyTorch checked those on sizes and metadata while
            # tracing (_assert_tensor_metadata, _assert_scalar); one on the data
            # (_assert_async) has a lowering: a device check.
            if registry_lowering(schema) is not None:
                self.lower_check(op, args, kwargs)
            return None
        origins = int_origins((args, kwargs))
        if name == "copy_" and not origins:
            return self.copy_into_input(args[0], args[1])
        metas = tree_map(lambda v: v.meta if isinstance(v, _Val) else (_META if isinstance(v, torch.device) else v),
                         (args, kwargs))
        try:
            out_meta = op(*metas[0], **metas[1])
        except Exception as e:  # noqa: BLE001 - re-raised with the op's name
            raise Unsupported(op, f"shape inference failed: {e}") from e
        if name in _LAZY_BITS:
            # A conjugate or negative "view" is a bit on the tensor, which
            # eager kernels never see (PyTorch resolves it first); a graph
            # value holds what it reads as: the conjugated or negated values.
            if name == "_conj" and not out_meta.is_complex():
                return args[0]
            return self.call_op(_LAZY_BITS[name], args, kwargs)
        if origins:
            return self.call_with_ints(op, schema, name, args, kwargs, metas, out_meta, origins)
        if is_view(schema):
            return self.view(op, schema, args, metas, out_meta)
        if mutates(schema):
            raise Unsupported(op, "mutates an argument (graphs are expected functional)")
        if not any(isinstance(r.type, torch.TensorType) or "Tensor" in str(r.type) for r in schema.returns):
            return out_meta  # sizes and other host values
        if name in _INDEX_PUTS and _mask_among_indices(args[1] if len(args) > 1 else kwargs.get("indices")):
            # Its long indices (nonzero) depend on the data: run where eager makes them.
            raise Unsupported(op, "a boolean mask among other index tensors")
        if name in _VIEW_SCATTERS and isinstance(args[0], _Val) and isinstance(args[1], _Val):
            return self.view_scatter(name, args, metas, out_meta)
        target = registry_lowering(schema)
        if target is None and name.endswith("_copy"):
            view_op = _view_of_copy(op)
            if view_op is not None:  # detach_copy, transpose_copy...: the view's values, in new memory
                v = self.call_op(view_op, args, kwargs)
                return [_Val(e.id, m) for e, m in zip(v, out_meta)] if isinstance(v, list) else _Val(v.id, out_meta)
        if target is None:
            custom = _custom_op_impl(op)
            if custom is not None:  # torch.library.custom_op written in torch ops: traced inline
                return self.trace_and_walk(op, custom, args, kwargs, on_device=True, constants=False)
            return _with_layout(self.decompose(op, args, kwargs), out_meta)
        lowering, overload, per_element = target
        if per_element:
            return self.foreach(schema, lowering, overload, args, kwargs, out_meta)
        return self.lower(schema, lowering, overload, args, kwargs, out_meta)

    # Functional collectives (DDP / FSDP2 / DTensor under torch.compile):
    # where the group's tpu backend runs collectives on the device, they are
    # lowered into the graph's program, which then runs replicated over the
    # group's devices; elsewhere the graph is compiled in pieces around them.
    _COLLECTIVES = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
                    "reduce_scatter_tensor": "reduce_scatter", "broadcast": "broadcast"}

    def collective(self, op, name, args):
        if name == "wait_tensor":
            return args[0]  # the program orders the collective before its readers
        kind = self._COLLECTIVES.get(name)
        if kind is None:
            raise Unsupported(op, "no graph lowering for this collective")
        x, group_name = args[0], args[-1]
        if not isinstance(x, _Val):
            raise Unsupported(op, "a collective on a value the graph does not hold")
        ids = _device_group_ids(group_name, self.device)
        if ids is None:
            raise Unsupported(op, "its process group runs collectives through host copies, not on the device")
        if self.replica_ids and self.replica_ids != ids:
            raise Unsupported(op, "collectives over two process groups in one graph")
        ranks, reduction, root = len(ids), "sum", 0
        if name in ("all_reduce", "reduce_scatter_tensor"):
            reduction = str(args[1]).lower()
            if reduction not in ("sum", "avg", "product", "min", "max"):
                raise Unsupported(op, f"reduction {args[1]!r} has no graph lowering")
        if name in ("all_gather_into_tensor", "reduce_scatter_tensor") and args[-2] != ranks:
            raise Unsupported(op, f"group size {args[-2]} for a group of {ranks} ranks")
        if name == "broadcast":
            root = int(args[1])
        shape = list(x.meta.shape)
        if not shape:
            raise Unsupported(op, "a collective on a 0-d tensor")
        if kind == "all_gather":
            shape[0] *= ranks
        elif kind == "reduce_scatter":
            if shape[0] % ranks:
                raise Unsupported(op, f"{shape[0]} rows do not split over {ranks} ranks")
            shape[0] //= ranks
        vid = self.prog.collective(kind, reduction, x.id, ranks, root)
        self.replica_ids = ids
        return _Val(vid, torch.empty(shape, dtype=x.meta.dtype, device=_META))

    # ---- Python ints the program takes at run time (_Int) ----
    # Where they meet an op: a registry lowering that reads them as values
    # (operand(): a wrapped number, a scalar, arange's start), the offset of
    # slice/select views and scatters, and int arithmetic. Anywhere else
    # (sizes, decompositions, control flow...) NeedsValue: their values then
    # key the program, as every int did before.
    _INT_ARITH = {operator.add: ("add", "Tensor"), operator.sub: ("sub", "Tensor"),
                  operator.mul: ("mul", "Tensor"), operator.floordiv: ("div", "Tensor_mode"),
                  operator.mod: ("remainder", "Tensor"), operator.neg: ("neg", ""),
                  torch.sym_max: ("maximum", ""), torch.sym_min: ("minimum", "")}  # (clamped indices)

    def int_value(self, v):
        return v.vid if isinstance(v, _Int) else self.prog.constant(int(v), torch.int64)

    def int_arith(self, node, target, a):
        """Int arithmetic on runtime ints, computed in the program too."""
        value = target(*a)
        if isinstance(value, int) and not isinstance(value, bool):
            value = int(value)  # (sym_min/sym_max return an argument: maybe an _Int)
        origins = int_origins(a)
        op = self._INT_ARITH.get(target) if type(value) is int else None
        if op is None:
            # (A comparison feeding only assertions: the host's guards hold it.)
            if all(isinstance(u.target, torch._ops.OpOverload) and not u.target._schema.returns for u in node.users):
                return value
            raise NeedsValue(origins, f"{getattr(target, '__name__', target)} of an int input")
        args = [("self", "t", self.int_value(a[0]))]
        if len(a) > 1:
            args.append(("other", "t", self.int_value(a[1])))
        if op[0] in ("add", "sub"):
            args.append(("alpha", "i", 1))
        if op[1] == "Tensor_mode":
            args.append(("rounding_mode", "s", "floor"))
        ids, _, _ = self.prog.call(op[0], op[1], args, [(torch.int64, [])])
        hosts = [v.host if isinstance(v, _Int) else (lambda _, c=v: c) for v in a]
        return _Int(value, ids[0], origins, lambda args: target(*[h(args) for h in hosts]))

    def scaled(self, v, stride):
        """The program's value of runtime int `v` times `stride`."""
        ids, _, _ = self.prog.call("mul", "Tensor", [("self", "t", v.vid), ("other", "t", self.int_value(stride))],
                                   [(torch.int64, [])])
        return ids[0]

    def call_with_ints(self, op, schema, name, args, kwargs, metas, out_meta, origins):
        if name in ("slice", "select", "slice_scatter", "select_scatter") and isinstance(args[0], _Val) \
                and not kwargs and isinstance(args[0].meta, torch.Tensor):
            scatter = name.endswith("_scatter")
            rest = list(args[2:] if scatter else args[1:])  # dim, then start/end/step or index
            if all(not isinstance(v, _Int) or k in (1, 2) for k, v in enumerate(rest)) and \
                    not isinstance(rest[0], _Int) and (len(rest) < 4 or not isinstance(rest[3], _Int)):
                return self.shifted(op, name, args, metas, out_meta, scatter, rest)
        if is_view(schema) or mutates(schema) or name in _INDEX_PUTS:
            raise NeedsValue(origins, f"aten::{name} with an int input")
        target = registry_lowering(schema)
        if target is None or target[2]:
            raise NeedsValue(origins, f"aten::{name} with an int input has no graph lowering of its own")
        return self.lower(schema, target[0], target[1], args, kwargs, out_meta, origins)

    def shifted(self, op, name, args, metas, out_meta, scatter, rest):
        """slice / select (or their scatters) at a runtime start or index:
        the view's offset is this call's minus the int's share, plus the
        program's value of it times the dim's stride."""
        base = args[0]
        dim = rest[0] if rest else 0
        dim = dim + base.meta.dim() if dim < 0 else dim
        stride = base.meta.stride()[dim]
        start = rest[1] if len(rest) > 1 else None  # slice's start, select's index
        view = (torch.ops.aten.select.int if name.startswith("select") else torch.ops.aten.slice.Tensor)(
            base.meta, *[int(r) if isinstance(r, int) else r for r in rest])
        if not isinstance(start, _Int):
            # Only the end is an input (it clamps to the size: no move).
            shift, static = None, view.storage_offset()
        else:
            shift = self.scaled(start, stride)
            static = view.storage_offset() - int(start) * stride
        origins = int_origins(rest)
        out_view = (list(view.shape), list(view.stride()), static)
        if scatter:
            src = args[1]
            if not isinstance(src, _Val) or not _is_dense(base.meta):
                raise NeedsValue(origins, f"aten::{name} into a tensor with gaps, at an int input")
            return _Val(self.prog.view_scatter(base.id, _strided(base.meta), out_view, src.id, shift), out_meta)
        m = out_meta
        return _Val(self.prog.view(base.id, _strided(base.meta), out_view, m.dtype, shift), m,
                    root=base.root or base, chain=base.chain + ((op, metas, 0, None),),
                    shifted=base.shifted | origins)

    def lower(self, schema, name, overload, args, kwargs, out_meta, origins=()):
        self.check_random(name, overload)
        single = isinstance(out_meta, torch.Tensor)
        metas = [out_meta] if single else list(out_meta)
        types = [_type(m) if isinstance(m, torch.Tensor) else None for m in metas]
        try:
            ids, mutations, read = self.prog.call(name, overload, self.pack(schema, args, kwargs), types,
                                                  self.forced_rng)
        except self.C.LoweringNotImplemented as e:  # e.g. a dtype: the op runs op by op, as in eager mode
            raise Unsupported(f"aten::{name}", str(e)) from e
        if read and origins:
            raise NeedsValue(origins, f"aten::{name}'s lowering reads the value of an int input")
        if mutations:
            raise Unsupported(f"aten::{name}", "its lowering writes an argument")
        vals = [None if i is None else _Val(i, m) for i, m in zip(ids, metas)]
        return vals[0] if single else tuple(vals)

    def check_random(self, name, overload):
        # A loop body's program runs once per iteration with the same key:
        # a random op there would draw the same numbers every time.
        if self.loop_depth and self.C.find_lowering(name, overload)[1]:
            raise Unsupported(f"aten::{name}", "a random op inside a while_loop or scan body")

    def foreach(self, schema, elem, overload, args, kwargs, out_meta):
        self.check_random(elem, overload)
        packed = self.pack(schema, args, kwargs)
        n = len(next(p[2] for p in packed if p[1] == "tl"))
        aliases = dict(self.C.foreach_aliases())
        results = []
        for e in range(n):
            elem_args = []
            for name, kind, payload in packed:
                if kind in ("tl", "fl", "il") and len(payload) == n and name not in ("size", "dim"):
                    kind, payload = {"tl": "t", "fl": "f", "il": "i"}[kind], payload[e]
                for alias in [name] + aliases.get(name, []):
                    elem_args.append((alias, kind, payload))
            m = out_meta[e]
            ids, mutations, _ = self.prog.call(elem, overload, elem_args, [_type(m)], self.forced_rng)
            if mutations:
                raise Unsupported(f"aten::{elem}", "its lowering writes an argument")
            results.append(_Val(ids[0], m))
        return results

    def with_effects(self, args, kwargs):
        """AOTAutograd's wrapper of an effectful op (token in, token out). An op
        that returns nothing and has a lowering (_linalg_check_errors: a device
        check) is lowered in place; the program keeps the order of its checks."""
        token, op, *rest = args
        self.lower_check(op, rest, kwargs)
        return (token,)

    def lower_check(self, op, args, kwargs):
        """An op that returns nothing, through its lowering: device checks
        (_assert_async, _linalg_check_errors)."""
        schema = getattr(op, "_schema", None)
        target = registry_lowering(schema) if schema is not None and not schema.returns else None
        if target is None or target[2]:
            raise Unsupported(op, "an op with no results and no graph lowering")
        if int_origins((args, kwargs)):
            raise NeedsValue(int_origins((args, kwargs)), f"{op} with an int input")
        _, mutations, _ = self.prog.call(target[0], target[1], self.pack(schema, args, kwargs), [])
        if mutations:
            raise Unsupported(op, "its lowering writes an argument")

    def decompose(self, op, args, kwargs):
        fn = decomposition(op)
        if fn is None:
            raise Unsupported(op, "no lowering and no PyTorch decomposition")
        return self.trace_and_walk(op, fn, args, kwargs)

    def higher_order(self, op, args, kwargs):
        """A higher-order op (flex_attention and its backward: subgraphs as
        arguments) through its dense implementation, traced to ATen ops."""
        fn = op.py_kernels.get(torch._C.DispatchKey.CompositeExplicitAutograd)
        if fn is None:
            raise Unsupported(op, "a higher-order op without a dense implementation")
        if getattr(op, "_name", "").startswith("auto_functionalized") and args:
            # A custom op that writes its arguments, as functionalization wraps
            # it: traced with its Python implementation in place of the op.
            impl = _custom_op_impl(args[0]) if isinstance(args[0], torch._ops.OpOverload) else None
            if impl is None:
                raise Unsupported(args[0], "a custom op that writes its arguments, without a Python implementation")
            return self.trace_and_walk(op, fn, (_Inline(args[0], impl), *args[1:]), kwargs, on_device=True,
                                       constants=False)
        return self.trace_and_walk(op, fn, args, kwargs, on_device=True)

    def trace_and_walk(self, op, fn, args, kwargs, on_device=False, constants=True):
        """Traces fn (a decomposition) on the arguments' metadata and walks
        the ATen graph it makes in place of `op`. `on_device`: on fake tpu
        tensors (subgraphs make tensors on the graph's device). `constants`:
        whether tensor constants the trace makes are allowed (not for user
        code: one made from host data, x.cpu().numpy(), would be frozen)."""
        from torch.fx.experimental.proxy_tensor import make_fx
        # FX's immutable lists become plain ones: decompositions may edit them.
        plain = lambda v: [plain(e) for e in v] if isinstance(v, list) else v  # noqa: E731
        flat, spec = tree_flatten(([plain(a) for a in args], {k: plain(v) for k, v in kwargs.items()}))
        where = [i for i, x in enumerate(flat) if isinstance(x, _Val)]

        def traced(*metas):
            f = list(flat)
            for i, m in zip(where, metas):
                f[i] = m
            a, k = tree_unflatten(f, spec)
            out = fn(*a, **k)
            if out is NotImplemented:  # (a decomposition that declines these arguments)
                raise NotImplementedError("the decomposition does not apply to these arguments")
            return out

        metas = [flat[i].meta for i in where]
        try:
            if on_device:  # (dense implementations write into new tensors: functionalized)
                from torch._subclasses.fake_tensor import FakeTensorMode
                device = torch.device("tpu", self.device or 0)
                with FakeTensorMode():
                    metas = [torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=device) for m in metas]
                    sub = make_fx(torch.func.functionalize(traced))(*metas)
            else:
                sub = make_fx(traced)(*metas)
        except Exception as e:  # noqa: BLE001 - the decomposition does not apply here
            what = "its dense implementation could not be traced" if on_device else "its PyTorch decomposition failed"
            raise Unsupported(op, f"{what}: {e}") from e
        if not constants and any(n.op == "get_attr" and isinstance(_attr(sub, n.target), torch.Tensor)
                                 for n in sub.graph.nodes):
            raise Unsupported(op, "its implementation makes a tensor the trace cannot follow (host data)")
        return self.walk(sub.graph, [flat[i] for i in where])

    def attribute(self, obj, name):
        """A get_attr of a (sub)graph: a higher-order op's subgraph, or a
        one-element tensor constant a traced decomposition made."""
        if isinstance(obj, torch.fx.GraphModule):
            return obj
        if isinstance(obj, torch.Tensor) and id(obj) in self.inputs_by_id:
            return self.inputs_by_id[id(obj)]  # a subgraph's constant, lifted to a graph input
        if isinstance(obj, torch.Tensor) and obj.numel() == 1 and not obj.is_complex() and obj.device.type != "meta":
            vid = self.prog.convert(self.prog.constant(obj.item(), obj.dtype), obj.dtype, list(obj.shape))
            return _Val(vid, torch.empty_strided(obj.shape, obj.stride(), dtype=obj.dtype, device=_META))
        raise Unsupported("get_attr", f"graph attribute {name}")

    def view_scatter(self, name, args, metas, out_meta):
        """diagonal_scatter / as_strided_scatter: PyTorch's decompositions
        write into a view of a copy (not functional); here the source is
        written into the base's layout where the view reads."""
        base, src = args[0], args[1]
        if not _is_dense(base.meta):
            raise Unsupported(name, "the base has gaps or broadcast dims")
        view = _VIEW_SCATTERS[name](base.meta, *metas[0][2:], **metas[1])
        return _Val(self.prog.view_scatter(base.id, _strided(base.meta), _strided(view), src.id), out_meta)

    def view(self, op, schema, args, metas, out_meta):
        base_pos = next(i for i, a in enumerate(schema.arguments) if a.alias_info is not None)
        base = args[base_pos]

        def one(m, index=None):
            return _Val(self.prog.view(base.id, _strided(base.meta), _strided(m), m.dtype), m,
                        root=base.root or base, chain=base.chain + ((op, metas, base_pos, index),),
                        shifted=base.shifted)
        if isinstance(out_meta, torch.Tensor):
            return one(out_meta)
        return [one(m, i) for i, m in enumerate(out_meta)]

    def copy_into_input(self, dst, src):
        if not isinstance(dst, _Val) or dst.input_index is None:
            raise Unsupported("aten::copy_", "writes a value that is not a graph input")
        new = self.prog.convert(src.id if isinstance(src, _Val) else self.prog.constant(src, dst.meta.dtype),
                                dst.meta.dtype, list(dst.meta.shape))
        self.written = {v: k for v, k in self.written.items() if k != dst.input_index}
        self.written[new] = dst.input_index
        if isinstance(src, _Val) and src.root is None and _type(src.meta) == _type(dst.meta):
            self.written[src.id] = dst.input_index  # the same values: views of src view the input
        self.mutations[dst.input_index] = new
        return _Val(new, dst.meta, dst.input_index)

    # ---- the walk ----
    def walk(self, graph, inputs, skip=(), top=False):
        """Walks `graph` with `inputs` for its placeholders (values or host
        constants); `skip`: copy_ nodes the host does; `top`: the graph
        PyTorch traced (its fake tensors are kept). Returns the structure
        of its output node."""
        env = {}
        it = iter(inputs)
        for node in graph.nodes:
            if node in skip:
                env[node] = env[node.args[0]]
            elif node.op == "placeholder":
                env[node] = next(it)
            elif node.op == "call_function":
                a, k = tree_map(lambda n: env[n] if isinstance(n, torch.fx.Node) else n, (node.args, node.kwargs))
                target = node.target
                if isinstance(target, torch._ops.OpOverload):
                    env[node] = v = self.call_op(target, a, k)
                    if top and isinstance(v, _Val) and isinstance(node.meta.get("val"), torch.Tensor):
                        self.fakes[v.id] = node.meta["val"]
                elif target is operator.getitem:
                    env[node] = a[0][a[1]]
                elif isinstance(target, torch._ops.HigherOrderOperator) and int_origins((a, k)):
                    raise NeedsValue(int_origins((a, k)), f"{target} with an int input")
                elif target is torch.ops.higher_order.with_effects:
                    env[node] = self.with_effects(a, k)
                elif getattr(target, "_name", None) in _LOWERED_HOPS:
                    env[node] = getattr(self, _LOWERED_HOPS[target._name])(node, a, k)
                elif isinstance(target, torch._ops.HigherOrderOperator):
                    env[node] = self.higher_order(target, a, k)
                elif any(isinstance(x, _Val) for x in tree_flatten((a, k))[0]):
                    raise Unsupported(target, "a Python function on tensors inside the graph")
                elif int_origins((a, k)):
                    if k:
                        raise NeedsValue(int_origins((a, k)), f"{target} of an int input")
                    env[node] = self.int_arith(node, target, a)
                else:
                    env[node] = target(*a, **k)  # SymInt arithmetic, now on ints
            elif node.op == "get_attr":
                env[node] = self.attribute(_attr(graph.owning_module, node.target), node.target)
            elif node.op == "output":
                return tree_map(lambda n: env[n] if isinstance(n, torch.fx.Node) else n, node.args[0])
            else:
                raise Unsupported(node.op, f"FX node kind '{node.op}' ({node.target})")
        raise Unsupported("graph", "no output node")


class HostPart:
    """What the host does itself for a graph: the nodes that update CPU
    inputs in place or make CPU outputs (an optimizer's step counts), when
    they depend on CPU values only. PyTorch runs them (no device round trip);
    the program recomputes any of their values it reads."""

    def __init__(self, gm, nodes, needed):
        g = torch.fx.Graph()
        env = {}
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                env[n] = g.node_copy(n)
        for n in nodes:
            env[n] = g.node_copy(n, lambda x: env[x])
        g.output(tuple(env[n] for n in needed))
        self.module = torch.fx.GraphModule(gm, g)
        self.nodes, self.needed = nodes, needed

    def __call__(self, args):
        return self.module(*args)


def _on_cpu(v):
    return all(not isinstance(t, torch.Tensor) or t.device.type == "cpu" for t in tree_flatten(v)[0])


def _host_only(node):
    """A check on CPU values that the host part runs: an op with no results
    and a lowering (_assert_async). Size assertions stay out: they hold
    already, and a host part costs every call."""
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and not schema.returns and not mutates(schema) \
        and registry_lowering(schema) is not None


def split_host(gm, args):
    """The HostPart of `gm` for `args`, or None when there is nothing for the host."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    on_host = {n for n, a in zip(placeholders, args) if _on_cpu(a)}
    for n in gm.graph.nodes:
        if n.op == "call_function" and ("val" in n.meta or _host_only(n)) and n.all_input_nodes and \
                all(i in on_host for i in n.all_input_nodes) and _on_cpu(n.meta.get("val")):
            on_host.add(n)
    output = list(gm.graph.nodes)[-1]
    roots = [n for n in gm.graph.nodes if n in on_host and n.op == "call_function"
             and n.target is torch.ops.aten.copy_.default]
    roots += [n for n in output.all_input_nodes if n in on_host and n.op == "call_function"]
    # Assertions on CPU values (torch._assert_async) raise at the call, as on CPU.
    roots += [n for n in on_host if _host_only(n)]
    if not roots:
        return None
    wanted, stack = set(), list(roots)
    while stack:
        n = stack.pop()
        if n in wanted or n.op != "call_function":
            continue
        wanted.add(n)
        stack.extend(n.all_input_nodes)
    nodes = [n for n in gm.graph.nodes if n in wanted]
    needed = [n for n in output.all_input_nodes if n in wanted]
    return HostPart(gm, nodes, needed)


_PACKS = {}  # values -> their int_pack tensor (never written: the run copies it)


def int_pack(args, runtime_ints):
    """The CPU tensor a program lowered with `runtime_ints` takes after the
    tensors of `args`: those ints' values."""
    values = tuple(args[i] for i in runtime_ints)
    pack = _PACKS.get(values)
    if pack is None:
        if len(_PACKS) >= 1024:
            _PACKS.clear()
        # (device: under torch.set_default_device("tpu") a bare tensor() is a tpu tensor)
        pack = _PACKS[values] = torch.tensor(values, dtype=torch.int64, device="cpu")
    return pack


def _with_layout(result, out_meta):
    """A decomposition's new values with the op's own layout: its last op
    (slice_scatter's where) may lay them out otherwise (contiguous where
    slice_scatter keeps its input's strides), and a later as_strided or view
    reads the memory order of the meta."""
    if isinstance(result, (list, tuple)) and isinstance(out_meta, (list, tuple)) and len(result) == len(out_meta):
        return type(result)(_with_layout(r, m) for r, m in zip(result, out_meta))
    if (isinstance(result, _Val) and isinstance(out_meta, torch.Tensor) and result.root is None
            and result.input_index is None and isinstance(result.meta, torch.Tensor)
            and _type(result.meta) == _type(out_meta) and result.meta.stride() != out_meta.stride()):
        return _Val(result.id, out_meta)
    return result


def lower_graph(gm, args, host_part=None, runtime_ints=()):
    """Lowers GraphModule `gm` for the concrete `args` (tensors and host
    scalars, one per placeholder); program input k is the k-th tensor of
    args. Nodes of `host_part` that write CPU inputs are left to the host.
    `runtime_ints`: positions of int args the program reads at run time
    from one more input after the tensors (int_pack); raises NeedsValue
    where an op needs one's value (the caller then keys the program by it)."""
    w = _Walker()
    skip = {n for n in host_part.nodes if n.target is torch.ops.aten.copy_.default or _host_only(n)} \
        if host_part else set()
    host_out = {n: i for i, n in enumerate(host_part.needed)} if host_part else {}
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    w.device = next((t.device.index or 0 for t in tensors if t.device.type == "tpu"), torch.tpu.current_device())
    cpu = [(k, _type(t)) for k, t in enumerate(tensors) if t.device.type == "cpu"]
    if runtime_ints:
        cpu.append((len(tensors), (torch.int64, [len(runtime_ints)])))
    ids = dict(zip((k for k, _ in cpu), w.prog.cpu_inputs(cpu)))
    runtime = {}  # arg position -> its _Int
    for j, i in enumerate(runtime_ints):
        vid = w.prog.view(ids[len(tensors)], ([len(runtime_ints)], [1], 0), ([], [], j), torch.int64)
        runtime[i] = _Int(args[i], vid, (i,), operator.itemgetter(i))
    inputs = []
    k = 0
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if k in ids:
                vid = ids[k]
            elif _state.C.covers_storage(a) or (a.numel() <= 1 and not _may_read_beyond(placeholders[i])):
                # (A one-element view is copied out per call: read in place,
                # the program would hold for its storage's size only, and a
                # diffusers timestep, timesteps[i], would compile the UNet
                # again for every num_inference_steps.)
                vid = w.prog.input(k, _type(a))
            else:
                vid = w.prog.input_view(k, a)  # read in the program: no copy first
            meta = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=_META)
            inputs.append(_Val(vid, meta, k))
            w.inputs_by_id[id(a)] = inputs[-1]
            k += 1
        else:
            inputs.append(runtime.get(i, a))
    graph = gm.graph
    result = w.walk(graph, inputs, skip, top=True)  # (get_attr nodes: _Walker.attribute)
    out_nodes = list(graph.nodes)[-1].args[0]
    out_ids, template, outputs = [], [], []
    storage_output = {}  # value id -> index into outputs

    def add_output(v, layout, on_cpu):
        if v.id not in storage_output:
            strides = list(layout.stride()) if _is_dense(layout) else []
            outputs.append((v.meta.dtype, list(v.meta.shape), strides, on_cpu, len(out_ids)))
            out_ids.append(v.id)
            storage_output[v.id] = len(outputs) - 1
        return storage_output[v.id]

    def layout_of(r, n):
        # The layout PyTorch traced matters: later graphs' views depend on it.
        # Static fake strides are that layout; else the walk's metas agree.
        # (A dynamic graph's fake sizes are symbols: this call's concrete metas then.)
        fake = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        if (isinstance(fake, torch.Tensor) and all(isinstance(d, int) for d in fake.shape)
                and fake.shape == r.meta.shape and all(isinstance(st, int) for st in fake.stride())
                and isinstance(fake.storage_offset(), int)):
            return fake
        return r.meta

    on_device = {k for k, t in enumerate(tensors) if t.device.type != "cpu"}
    # Values returned whole, with the layout they are returned in: a view of
    # one of them must come back as a view of it (PyTorch's aliasing).
    returned = {r.id: layout_of(r, n) for r, n in zip(result, out_nodes)
                if isinstance(r, _Val) and n not in host_out and r.root is None}
    shared = {}  # root id -> how many outputs view it
    for r in result:
        if isinstance(r, _Val) and r.root is not None:
            shared[r.root.id] = shared.get(r.root.id, 0) + 1

    def input_view(r):
        # ("i", k, view): r views graph input k itself, or the value the graph
        # writes into input k (read after the write, the input holds it):
        # its view ops replayed on the input's own layout, which the value's
        # may not share (a write into a strided input makes a dense value).
        root = r.root
        k = root.input_index if root.input_index is not None and root.id not in w.written else w.written.get(root.id)
        if k is None or k not in on_device or list(root.meta.shape) != list(tensors[k].shape):
            return None
        v = torch.empty_strided(tensors[k].shape, tensors[k].stride(), dtype=tensors[k].dtype, device=_META)
        try:
            for op, (args, kwargs), pos, index in r.chain:
                if pos >= len(args):
                    return None
                v = op(*args[:pos], v, *args[pos + 1:], **kwargs)
                v = v if index is None else v[index]
        except RuntimeError:
            return None  # not a view of the input's layout (a view() of strided memory)
        if v.shape != r.meta.shape or v.dtype != r.meta.dtype:
            return None
        entry = ("i", k, list(v.shape), list(v.stride()), v.storage_offset())
        return entry if v.dtype == tensors[k].dtype else entry + (v.dtype,)  # view_as_real, .view(dtype)

    def output_view(r):
        # ("v", k, view): r views an intermediate that comes back as output k
        # (returned itself, viewed by several outputs, or r is not dense).
        root = r.root
        if r.meta.dtype != root.meta.dtype or not _is_dense(root.meta):
            return None
        if root.id in returned:
            if list(returned[root.id].stride()) != list(root.meta.stride()):
                return None
        elif shared[root.id] < 2 and _is_dense(r.meta):
            return None  # alone: its own buffer, without the rest of the root
        k = add_output(root, root.meta, False)
        return ("v", k, list(r.meta.shape), list(r.meta.stride()), r.meta.storage_offset() - root.meta.storage_offset())

    def replayed_view(r):
        # ("r", source, k, chain): the view ops of r replayed per call, with
        # that call's ints, on input k ("i": r views it, or the value the
        # graph writes into it) or on program output k ("o": r's root).
        root = r.root
        k = root.input_index if root.input_index is not None and root.id not in w.written else w.written.get(root.id)
        if k is not None and k in on_device and list(root.meta.shape) == list(tensors[k].shape) and \
                list(root.meta.stride()) == list(tensors[k].stride()):
            return ("r", "i", k, r.chain)
        if root.input_index is not None or not _is_dense(root.meta):
            raise NeedsValue(r.shifted, "a view at an int input's offset returned")
        return ("r", "o", add_output(root, root.meta, False), r.chain)

    for r, n in zip(result, out_nodes):
        if n in host_out:
            template.append(("h", host_out[n]))
            continue
        if isinstance(r, _Int):  # (a SymInt saved for the backward): the call's value
            template.append(("n", r.host))
            continue
        if not isinstance(r, _Val):
            if int_origins(r):  # (returned as it is: its value would be kept)
                raise NeedsValue(int_origins(r), "an int input returned")
            template.append(("c", r))
            continue
        fake = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        on_cpu = isinstance(fake, torch.Tensor) and fake.device.type == "cpu" and r.id not in w.rng_states
        if r.shifted and not on_cpu:  # a view at this call's offset: made again per call
            template.append(replayed_view(r))
            continue
        entry = None if r.root is None or on_cpu else input_view(r) or output_view(r)
        template.append(entry or ("t", add_output(r, layout_of(r, n), on_cpu)))
    mutations = []
    for input_index, vid in w.mutations.items():
        mutations.append((input_index, len(out_ids)))
        out_ids.append(vid)
    text = w.prog.finish(out_ids, [o[2] for o in outputs])
    # Without tpu inputs (a graph of factories), the device PyTorch traced.
    device = next((t.device.index or 0 for n in out_nodes if isinstance(n, torch.fx.Node)
                   for t in [n.meta.get("val")] if isinstance(t, torch.Tensor) and t.device.type == "tpu"),
                  torch.tpu.current_device())
    lowered = Lowered(w.prog, text, outputs, template, mutations, host_part, device, w.replica_ids)
    lowered.runtime_ints = tuple(runtime_ints)
    return lowered
