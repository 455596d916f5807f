"""Float arguments on every registry op: called on tpu with two clearly different values in
one process, each result compared with CPU.

Float arguments (Python floats, double Scalars: add's alpha, an lr) are runtime program
inputs, so one program serves every value (docs/ARCHITECTURE.md, "Runtime scalars"). That is
only right where the value reaches the program as data: a value that decides the result's
shape (arange's end) or that a lowering reads when it builds the program must key the
program by value. Calling v1 then v2 catches a program built for v1 being reused for v2.

Which overloads ("the universe"): every ATen overload (functional, in-place, out=,
_foreach_) whose base name has a lowering (torch_pjrt.supported_ops()), that reaches the
executor (CompositeImplicitAutograd ones decompose first; their floats reach the leaf
overloads tested here) and that has an argument of type float, float?, Scalar, Scalar? or
Scalar[]. test_coverage asserts each is exercised or in SKIP.

Calls: PyTorch's OpInfo samples (float32, forward and backward, the first few per OpInfo)
run once on CPU under a TorchDispatchMode that records the ATen calls; hand-written calls
cover factories, fused optimizers, AMP, _foreach_ and random ops. In-place and out= forms
are derived from a related call by argument names. Per float argument the first call whose
CPU results differ between v1 and v2 is used (a value that changes nothing proves nothing).
Random ops compare shapes, dtypes and statistics instead of values. Failures that do not
depend on the value are KNOWN_FAILURES (xfail).

An op is learned as keyed by value once per process, so what ran before can hide a miss:
test_shape_deciding_floats_fresh_process checks arange's forms in a fresh interpreter.
"""
import dataclasses
import fnmatch
import itertools
import json
import re
import warnings

import pytest
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import opinfo_harness as h
import torch_pjrt
from conftest import TOLERANCES, make, run_json, run_python

# Schema types of a float-carrying argument (Scalar prints as "number").
FLOAT_TYPES = {"float", "Optional[float]", "number", "Optional[number]", "List[number]"}

RANDOM = {name for name, _, rng in torch_pjrt.supported_ops_table() if rng}


def _is_random(name):
    """Needs the lowering's random state, so compared by statistics (sdpa's fused
    attention is random only with dropout_p > 0, which is skipped)."""
    return _lowering_base(name) in RANDOM and not _lowering_base(name).startswith("_scaled_dot_product")


# Not exercised: overload or family (name without a trailing "_" and overload), optionally
# "/arg" for one argument (fnmatch patterns) -> why.
SKIP = {
    "bitwise_and": "Scalar is integer-only: CPU rejects a float",
    "bitwise_or": "Scalar is integer-only: CPU rejects a float",
    "bitwise_xor": "Scalar is integer-only: CPU rejects a float",
    "cauchy": "heavy-tailed draws (no mean): tests/test_random.py checks median and quartiles per value",
    "log_normal": "heavy-tailed draws at the second value: tests/test_random.py checks the log's moments",
    "geometric": "integer-valued draws: tests/test_random.py checks its moments",
    "bitwise_left_shift": "shifts are integer-only: CPU rejects a float",
    "bitwise_right_shift": "shifts are integer-only: CPU rejects a float",
    "__lshift__": "shifts are integer-only: CPU rejects a float",
    "__rshift__": "shifts are integer-only: CPU rejects a float",
    "__ilshift__": "shifts are integer-only: CPU rejects a float",
    "__irshift__": "shifts are integer-only: CPU rejects a float",
    "addmm.dtype*": "no CPU kernel to compare with (out_dtype matmul is CUDA-only in PyTorch)",
    "baddbmm.dtype*": "no CPU kernel to compare with (out_dtype matmul is CUDA-only in PyTorch)",
    "_batch_norm_no_update*/momentum": "eval mode: the running stats are not updated, momentum is unused",
    "_batch_norm_with_update.out": "no Meta kernel in PyTorch: runs on the CPU fallback (executor.cpp)",
    "_scaled_dot_product_fused_attention_overrideable/dropout_p":
        "random (p > 0 drops attention weights); scale is exercised",
    "_scaled_dot_product_fused_attention_overrideable_backward/dropout_p":
        "needs the forward's dropout state; scale is exercised",
}

# Failures that do not depend on the float's value (v1 fails as well): bugs of their own,
# run as non-strict xfail so that they stay visible. Keys: overload or "overload/arg"
# (fnmatch patterns; no family matching, so in-place forms are not covered).
KNOWN_FAILURES = {
    "_fused_adam": "the eager executor cannot return a tuple of tensor lists",
    "_fused_adamw": "the eager executor cannot return a tuple of tensor lists",
    "_fused_adam.tensor_lr*": "the meta pass fails: _fused_adam_.tensor_lr has no Meta kernel",
    "_fused_adamw.tensor_lr*": "the meta pass fails: _fused_adamw_.tensor_lr has no Meta kernel",
    "_fused_sgd.tensor_lr*": "the meta pass fails: _fused_sgd_.tensor_lr has no Meta kernel",
    "_fused_sgd": "the meta pass fails: _fused_sgd_ has no Meta kernel",
    "_fused_adagrad": "the eager executor cannot return a tuple of tensor lists",
    "_fused_adagrad.tensor_lr": "the eager executor cannot return a tuple of tensor lists",
    "_amp_update_scale.out":
        "CPU's out= kernel leaves growth_tracker (annotated as written) as it was; tpu updates it",
    "_native_batch_norm_legit_no_training*": "tpu returns save_mean/save_invstd of shape (C,), CPU empty",
    "_batch_norm_no_update*": "tpu returns save_mean/save_invstd of shape (C,), CPU empty",
    "add.Scalar_out/alpha": "PyTorch's Meta kernel (torch._refs.add) rejects a positional alpha",
    "sub.Scalar_out/alpha": "PyTorch's Meta kernel (torch._refs.sub) rejects a positional alpha",
    "normal.out": "PyTorch's Meta kernel for normal.out rejects std values other than 1.0 ('normal expects mean and "
                  "std to be scalars when size is defined'); CPU's kernel has no such check",
}

MAX_RECORDED = 4       # calls kept per overload from the OpInfo samples
SAMPLES_PER_OPINFO = 3


# ---- the universe ---------------------------------------------------------------------------

def _family(name):
    """'add_.Tensor' -> 'add'; '_foreach_add.Scalar' -> '_foreach_add'."""
    base = name.split(".")[0]
    if len(base) > 1 and base.endswith("_") and not base.startswith("__"):
        base = base[:-1]
    return base


def _lowering_base(name):
    base = _family(name)
    return base[len("_foreach_"):] if base.startswith("_foreach_") else base


def _overload(name):
    base, _, ov = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), ov or "default")


def _float_args(schema):
    return [a.name for a in schema.arguments if str(a.type) in FLOAT_TYPES and not a.is_out]


def _served(name, entries):
    """Whether the executor finds a lowering for the overload (as find_lowering() and
    lowering_fallback() in csrc/ look it up: "base.overload", else "base")."""
    base, _, ov = name.partition(".")
    if base.startswith("_foreach_"):
        ov = {"List": "Tensor", "ScalarList": "Scalar"}.get(ov, ov)
    base = _lowering_base(base)
    return base in entries or f"{base}.{ov}" in entries


def _universe():
    entries = set(torch_pjrt.supported_ops())
    found = {}
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::"):
            continue
        name = full[len("aten::"):]
        if not _served(name, entries):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeImplicitAutograd"):
            continue
        args = _float_args(_overload(name)._schema)
        if args:
            found[name] = args
    return dict(sorted(found.items()))


UNIVERSE = _universe()


def _lookup(table, name, arg=None, family=True):
    """table[key] for the first key (fnmatch pattern) matching "name/arg" or name (or, with
    family, the same for the family name)."""
    names = [name, _family(name)] if family else [name]
    keys = ([f"{n}/{arg}" for n in names] if arg else []) + names
    for pattern, reason in table.items():
        if any(fnmatch.fnmatchcase(k, pattern) for k in keys):
            return reason
    return None


def _skip_reason(name, arg=None):
    return _lookup(SKIP, name, arg)


# ---- values ---------------------------------------------------------------------------------

DEFAULT_VALUES = (0.5, -1.25)
# (v1, v2) by argument name, then "family.arg" overrides: valid for the op and far enough
# apart that results (or shapes) differ.
VALUES = {
    "eps": (1e-5, 0.5), "momentum": (0.1, 0.7), "p": (2.0, 3.5), "ord": (2.0, 3.5),
    "correction": (0.0, 1.5), "delta": (1.0, 0.25), "beta": (1.0, 0.25),
    "min_val": (-1.0, -0.25), "max_val": (1.0, 0.5), "scale": (0.5, 2.0), "input_scale": (1.0, 2.5),
    "scales": (1.5, 3.0), "scales_d": (1.5, 3.0), "scales_h": (1.5, 3.0), "scales_w": (1.5, 3.0),
    "lr": (1e-3, 0.1), "beta1": (0.9, 0.5), "beta2": (0.999, 0.9), "weight_decay": (0.01, 0.2),
    "dampening": (0.0, 0.3), "scale_growth_factor": (2.0, 3.0), "scale_backoff_factor": (0.5, 0.25),
    # shape-deciding: arange's length changes (10 -> 7, 6, 4)
    "start": (0.5, 3.5), "end": (10.0, 6.0), "step": (1.0, 2.5),
    "mean": (0.5, -1.25), "std": (1.0, 3.0), "from": (-1.0, 0.5), "to": (1.0, 4.0),
    "lambd": (0.5, 1.25),  # (softshrink rejects a negative one)
    "histc.min": (-1.0, -0.25), "histc.max": (1.0, 0.5),  # (min < max: both valid)
    "bernoulli.p": (0.25, 0.75), "native_dropout.p": (0.25, 0.75), "pow.self": (0.5, 2.5),
    "renorm.maxnorm": (0.5, 1.25), "exponential.lambd": (0.5, 4.0),  # (renorm rejects a negative one)
}


def _values(name, arg):
    base = _lowering_base(name)
    return VALUES.get(f"{base}.{arg}") or VALUES.get(arg) or DEFAULT_VALUES


# ---- calls ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Call:
    name: str          # overload, e.g. "add.Tensor"
    values: dict       # argument name -> CPU value (omitted = schema default)
    where: str = ""    # where the call came from

    @property
    def schema(self):
        return _overload(self.name)._schema

    def with_value(self, arg, v):
        values = dict(self.values)
        t = next(a.type for a in self.schema.arguments if a.name == arg)
        if str(t) == "List[number]":
            n = len(values.get(arg) or ()) or 2
            v = [v + i for i in range(n)]
        values[arg] = v
        # eq/ne against a float: put both values in the input, so that results differ.
        if _lowering_base(self.name) in ("eq", "ne") and arg == "other" and \
                isinstance(values.get("self"), torch.Tensor) and values["self"].numel() > 1:
            x = values["self"].clone().contiguous()
            x.view(-1)[:2] = torch.tensor(_values(self.name, arg))
            values["self"] = x
        return Call(self.name, values, self.where)


def _place(v, device, is_device_arg=False):
    if isinstance(v, torch.Tensor):
        return v.detach().clone() if device == "cpu" else v.detach().to(device)
    if isinstance(v, torch.device) or (is_device_arg and isinstance(v, str)):
        return torch.device(device)
    if isinstance(v, (list, tuple)):
        return type(v)(_place(e, device) for e in v)
    return v


def _crashes_cpu(call):
    """A call whose CPU kernel crashes the process (never run on CPU)."""
    return call.name.startswith("_native_batch_norm_legit.no_stats") and not call.values.get("training", True)


def run(call, device):
    """(result, tensor arguments afterwards) of the call on `device`."""
    if device == "cpu" and _crashes_cpu(call):
        raise RuntimeError(f"{call.name}: CPU's kernel segfaults in eval mode without running stats")
    schema = call.schema
    placed = {k: _place(v, device, k == "device") for k, v in call.values.items()}
    pos, kw, positional = [], {}, True
    for a in schema.arguments:
        if a.name not in placed:
            positional = False
            continue
        if positional and not a.kwarg_only:
            pos.append(placed[a.name])
        else:
            kw[a.name] = placed[a.name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = _overload(call.name)(*pos, **kw)
    # every tensor argument afterwards: in-place and out= results, and undeclared
    # updates (native_batch_norm's running stats)
    mutated = [placed[a.name] for a in schema.arguments if a.name in placed and
               any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(placed[a.name]))]
    return out, mutated


def _bind(func, args, kwargs):
    values = {a.name: v for a, v in zip(func._schema.arguments, args)}
    values.update(kwargs)
    return pytree.tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, values)


def _func_name(func):
    s = func._schema
    return s.name.split("::")[1] + ("." + s.overload_name if s.overload_name else "")


# ---- recording OpInfo samples ---------------------------------------------------------------

class _Recorder(TorchDispatchMode):
    def __init__(self, families, calls):
        super().__init__()
        self.families, self.calls, self.source = families, calls, "opinfo"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _func_name(func) if hasattr(func, "_schema") else ""
        if name and _family(name) in self.families:
            kept = self.calls.setdefault(name, [])
            if len(kept) < MAX_RECORDED:
                kept.append(Call(name, _bind(func, args, kwargs), self.source))
        return func(*args, **kwargs)


def _wanted_opinfo(op, registry):
    # OpInfos of registry ops, and interpolate (it reaches the upsample_* lowerings)
    return h.is_direct(op, registry) or op.name == "nn.functional.interpolate"


def record_opinfo_calls(families):
    """overload -> up to MAX_RECORDED calls seen while running the OpInfo samples on CPU."""
    calls, errors = {}, []
    rec = _Recorder(families, calls)
    registry = h.registry_names()
    for op in h.load_op_db():
        if not _wanted_opinfo(op, registry) or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        rec.source = "OpInfo " + h.op_key(op)
        grad = op.supports_autograd
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                samples = list(itertools.islice(
                    op.sample_inputs("cpu", torch.float32, requires_grad=grad), SAMPLES_PER_OPINFO))
            except Exception as e:
                errors.append(f"{h.op_key(op)}: {type(e).__name__}: {e}")
                continue
            for s in samples:
                try:
                    with rec:
                        out = op.op(s.input, *s.args, **s.kwargs)
                        leaves = [t for t in pytree.tree_leaves(out)
                                  if isinstance(t, torch.Tensor) and t.requires_grad]
                        ins = [t for t in pytree.tree_leaves((s.input, s.args, s.kwargs))
                               if isinstance(t, torch.Tensor) and t.requires_grad]
                        if leaves and ins:  # records the backward ops too
                            torch.autograd.grad(sum((t * 1.5).sum() for t in leaves), ins, allow_unused=True)
                except Exception:
                    continue
    assert calls, f"no OpInfo sample ran on CPU; first error: {errors[:1]}"
    return calls


# ---- hand-written calls ---------------------------------------------------------------------

CPU = torch.device("cpu")


def _pos(shape, seed=0):
    return make(shape, low=0.5, high=2, seed=seed)


def _foreach_call(name):
    """A schema-driven call of a functional _foreach_ overload: lists of two tiny tensors."""
    values = {}
    for i, a in enumerate(_overload(name)._schema.arguments):
        t = str(a.type)
        if t == "List[Tensor]":
            values[a.name] = [make((3,), low=-2, high=2, seed=i),
                              make((2, 2), low=-2, high=2, seed=i + 10)]
        elif t == "Tensor":
            values[a.name] = make((), seed=i)
        elif t == "number":
            values[a.name] = 0.5
        elif t == "List[number]":
            values[a.name] = [0.5, 1.5]
        elif not a.has_default_value():
            return None
    return Call(name, values, "foreach generator")


def _upsample_call(family):
    """upsample_*{1,2,3}d[_backward] from 3 to (5, 4, 5)[:d] elements, align_corners=False
    (with True the scales are unused)."""
    d = int(re.search(r"(\d)d", family).group(1))
    size_in, size_out = [3] * d, [5, 4, 5][:d]
    if family.endswith("_backward"):
        v = dict(grad_output=make([1, 2] + size_out), output_size=size_out, input_size=[1, 2] + size_in)
    else:
        v = dict(self=make([1, 2] + size_in), output_size=size_out)
    if any(a.name == "align_corners" for a in _overload(family)._schema.arguments):
        v["align_corners"] = False
    return Call(family, v)


def _adam(name):
    p = [make((3,), seed=1), make((2, 2), seed=2)]
    v = dict(self=p, grads=[make(t.shape, seed=3 + i) for i, t in enumerate(p)],
             exp_avgs=[make(t.shape, seed=5 + i) for i, t in enumerate(p)],
             exp_avg_sqs=[_pos(t.shape, seed=7 + i) for i, t in enumerate(p)], max_exp_avg_sqs=[],
             state_steps=[torch.tensor(3.0), torch.tensor(3.0)], lr=1e-3, beta1=0.9, beta2=0.999,
             weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False)
    if name.endswith("tensor_lr"):
        v["lr"] = torch.tensor(1e-3)
    return Call(name, v)


def _sgd(name):
    p = [make((3,), seed=1), make((2, 2), seed=2)]
    v = dict(self=p, grads=[make(t.shape, seed=3 + i) for i, t in enumerate(p)],
             momentum_buffer_list=[make(t.shape, seed=5 + i) for i, t in enumerate(p)],
             weight_decay=0.01, momentum=0.9, lr=1e-3, dampening=0.0, nesterov=False, maximize=False,
             is_first_step=False)
    if name.endswith("tensor_lr"):
        v["lr"] = torch.tensor(1e-3)
    return Call(name, v)


def _adagrad(name):
    p = [make((3,), seed=1), make((2, 2), seed=2)]
    v = dict(self=p, grads=[make(t.shape, seed=3 + i) for i, t in enumerate(p)],
             state_sums=[_pos(t.shape, seed=5 + i) for i, t in enumerate(p)],
             state_steps=[torch.tensor(3.0), torch.tensor(3.0)], lr=1e-2, lr_decay=0.1,
             weight_decay=0.01, eps=1e-10, maximize=False)
    if name.endswith("tensor_lr"):
        v["lr"] = torch.tensor(1e-2)
    return Call(name, v)


def _amp(found_inf):
    # growth_tracker at interval - 1 with no inf: the scale grows; with inf: it backs off.
    return Call("_amp_update_scale", dict(
        self=torch.tensor(1024.0), growth_tracker=torch.tensor(1, dtype=torch.int32),
        found_inf=torch.tensor(float(found_inf)), scale_growth_factor=2.0, scale_backoff_factor=0.5,
        growth_interval=2))


def hand_calls():
    """Calls for what the OpInfo samples miss or reach only with values that change nothing.
    Float values here are placeholders: each test sets v1 and v2."""
    x, y, g = make((3, 4)), make((3, 4), seed=1), make((3, 4), seed=2)
    x01 = make((3, 4), low=0, high=1)  # logit's domain
    idx = torch.tensor([[0, 1], [2, 3], [1, 1]])
    bn = dict(input=make((4, 3, 2)), weight=_pos((3,)), bias=make((3,)), running_mean=make((3,)),
              running_var=_pos((3,)), momentum=0.1, eps=1e-5)
    c = [
        # factories (their functional forms keep PyTorch's kernels, which call the out= forms)
        Call("arange", dict(end=10.0, device=CPU)),
        Call("arange.start", dict(start=0.5, end=10.0, device=CPU)),
        Call("arange.start_step", dict(start=0.5, end=10.0, step=1.0, device=CPU)),
        Call("linspace", dict(start=0.5, end=10.0, steps=7, device=CPU)),
        Call("linspace.Scalar_Tensor", dict(start=0.5, end=torch.tensor(10.0), steps=7, device=CPU)),
        Call("linspace.Tensor_Scalar", dict(start=torch.tensor(0.5), end=10.0, steps=7, device=CPU)),
        Call("full", dict(size=[2, 3], fill_value=0.5, device=CPU)),
        Call("full_like", dict(self=x, fill_value=0.5)),
        Call("new_full", dict(self=x, size=[3, 2], fill_value=0.5)),
        Call("scalar_tensor", dict(s=0.5, device=CPU)),
        Call("fill.Scalar", dict(self=x, value=0.5)),
        # pointwise with a Scalar
        Call("add.Scalar", dict(self=x, other=0.5)),
        Call("sub.Scalar", dict(self=x, other=0.5)),
        Call("rsub.Scalar", dict(self=x, other=0.5, alpha=0.5)),
        Call("mul.Scalar", dict(self=x, other=0.5)),
        Call("div.Scalar", dict(self=x, other=0.5)),
        Call("div.Scalar_mode", dict(self=x, other=0.5, rounding_mode="floor")),
        Call("div.Scalar_mode", dict(self=x, other=0.5, rounding_mode="trunc")),
        Call("floor_divide.Scalar", dict(self=x, other=0.5)),
        Call("fmod.Scalar", dict(self=x, other=0.5)),
        Call("isin.Tensor_Scalar", dict(elements=torch.tensor([0.5, 1.0, 2.5]), test_element=0.5)),
        Call("isin.Scalar_Tensor", dict(element=0.5, test_elements=torch.tensor([0.5, 1.0, 2.5]))),
        Call("remainder.Scalar", dict(self=x, other=0.5)),
        Call("remainder.Scalar_Tensor", dict(self=0.5, other=x)),
        Call("pow.Tensor_Scalar", dict(self=_pos((3, 4)), exponent=0.5)),
        Call("pow.Scalar", dict(self=0.5, exponent=x)),
        Call("xlogy.Scalar_Other", dict(self=x, other=0.5)),
        Call("xlogy.Scalar_Self", dict(self=0.5, other=_pos((3, 4)))),
        Call("special_xlog1py.other_scalar", dict(self=x, other=0.5)),
        Call("special_xlog1py.self_scalar", dict(self=0.5, other=_pos((3, 4)))),
        Call("special_zeta.other_scalar", dict(self=_pos((3, 4)) + 1, other=0.5)),
        Call("special_zeta.self_scalar", dict(self=1.5, other=_pos((3, 4)))),
        Call("renorm", dict(self=x, p=2.0, dim=0, maxnorm=0.5)),
        Call("_addmm_activation", dict(self=make((4,)), mat1=x, mat2=make((4, 4), seed=3), beta=0.5, alpha=0.5,
                                       use_gelu=True)),
        Call("_addmm_activation.out", dict(self=make((4,)), mat1=x, mat2=make((4, 4), seed=3), beta=0.5, alpha=0.5,
                                           use_gelu=False, out=torch.empty(3, 4))),
        Call("copysign.Scalar", dict(self=x, other=0.5)),
        Call("searchsorted.Scalar", dict(sorted_sequence=torch.tensor([-2.0, 0.0, 1.0]), self=0.5)),
        Call("bucketize.Scalar", dict(self=0.5, boundaries=torch.tensor([-2.0, 0.0, 1.0]))),
        *[Call(f"{op}.Scalar", dict(self=x, other=0.5)) for op in ("eq", "ne", "lt", "le", "gt", "ge")],
        Call("clamp", dict(self=x, min=-0.5, max=1.0)),
        Call("clamp_min", dict(self=x, min=0.5)),
        Call("clamp_max", dict(self=x, max=0.5)),
        Call("lerp.Scalar", dict(self=x, end=y, weight=0.5)),
        Call("addcmul", dict(self=x, tensor1=y, tensor2=g, value=0.5)),
        Call("addcdiv", dict(self=x, tensor1=y, tensor2=_pos((3, 4)), value=0.5)),
        Call("masked_fill.Scalar", dict(self=x, mask=make((3, 4), torch.bool), value=0.5)),
        Call("index_fill.int_Scalar", dict(self=x, dim=1, index=torch.tensor([0, 2]), value=0.5)),
        Call("scatter.value", dict(self=x, dim=1, index=idx, value=0.5)),
        Call("scatter.value_reduce", dict(self=x, dim=1, index=idx, value=0.5, reduce="multiply")),
        Call("constant_pad_nd", dict(self=x, pad=[1, 1], value=0.5)),
        # activations, losses and their backward
        Call("threshold", dict(self=x, threshold=0.5, value=0.5)),
        Call("threshold_backward", dict(grad_output=g, self=x, threshold=0.5)),
        Call("hardtanh", dict(self=x, min_val=-1.0, max_val=1.0)),
        Call("hardtanh_backward", dict(grad_output=g, self=x, min_val=-1.0, max_val=1.0)),
        Call("leaky_relu", dict(self=x, negative_slope=0.5)),
        Call("leaky_relu_backward", dict(grad_output=g, self=x, negative_slope=0.5, self_is_result=False)),
        Call("elu", dict(self=x, alpha=1.0, scale=1.0, input_scale=1.0)),
        Call("elu_backward", dict(grad_output=g, alpha=1.0, scale=1.0, input_scale=1.0, is_result=False,
                                  self_or_result=x)),
        Call("softshrink", dict(self=x, lambd=0.5)),
        Call("softplus", dict(self=x, beta=1.0, threshold=0.5)),
        Call("softplus_backward", dict(grad_output=g, self=x, beta=1.0, threshold=0.5)),
        Call("logit", dict(self=x01, eps=0.1)),
        Call("logit_backward", dict(grad_output=g, self=x01, eps=0.1)),
        Call("huber_loss", dict(self=x, target=y, reduction=1, delta=1.0)),
        Call("huber_loss_backward", dict(grad_output=make(()), self=x, target=y, reduction=1, delta=1.0)),
        Call("smooth_l1_loss", dict(self=x, target=y, reduction=1, beta=1.0)),
        Call("smooth_l1_loss_backward", dict(grad_output=make(()), self=x, target=y, reduction=1, beta=1.0)),
        Call("native_dropout_backward", dict(grad_output=g, mask=make((3, 4), torch.bool), scale=2.0)),
        # reductions
        Call("histc", dict(self=x, bins=4, min=-1.0, max=1.0)),
        Call("_cdist_forward", dict(x1=x, x2=y, p=2.0, compute_mode=None)),
        Call("_cdist_backward", dict(grad=make((3, 3)), x1=x, x2=y, p=2.0,
                                     cdist=torch.cdist(x, y, p=2.0))),
        Call("norm.Scalar", dict(self=x, p=2.0)),
        Call("norm.ScalarOpt_dim", dict(self=x, p=2.0, dim=[1])),
        Call("norm.ScalarOpt_dim_dtype", dict(self=x, p=2.0, dim=[1], keepdim=False, dtype=torch.float64)),
        Call("norm.ScalarOpt_dtype", dict(self=x, p=2.0, dtype=torch.float64)),
        Call("linalg_vector_norm", dict(self=x, ord=2.0, dim=[1])),
        Call("std.correction", dict(self=x, dim=[1], correction=1.0)),
        Call("var.correction", dict(self=x, dim=[1], correction=1.0)),
        Call("std_mean.correction", dict(self=x, dim=[1], correction=1.0)),
        Call("var_mean.correction", dict(self=x, dim=[1], correction=1.0)),
        # normalization (training: momentum updates the running stats)
        Call("native_batch_norm", dict(bn, training=True)),
        Call("_native_batch_norm_legit_functional", dict(bn, training=True)),
        Call("_native_batch_norm_legit_no_training", bn),
        Call("_batch_norm_with_update", bn),
        Call("_batch_norm_with_update_functional", bn),
        Call("_batch_norm_no_update", bn),
        Call("_native_batch_norm_legit", dict(bn, training=True)),
        Call("_native_batch_norm_legit.no_stats",
             {k: v for k, v in dict(bn, training=True).items() if not k.startswith("running")}),
        # optimizers, AMP
        _amp(0), _amp(1),
    ]
    c += [_adam(n) for n in ("_fused_adam", "_fused_adam.tensor_lr", "_fused_adamw",
                             "_fused_adamw.tensor_lr")]
    c += [_sgd(n) for n in ("_fused_sgd", "_fused_sgd.tensor_lr")]
    c += [_adagrad(n) for n in ("_fused_adagrad", "_fused_adagrad.tensor_lr")]
    for fam in sorted({_family(n) for n in UNIVERSE if "upsample" in n}):
        c.append(_upsample_call(fam))
    for name in UNIVERSE:
        if name.startswith("_foreach_") and not name.split(".")[0].endswith("_") and "out" not in name:
            fc = _foreach_call(name)
            if fc:
                c.append(fc)
    for call in c:
        call.where = call.where or "hand"
    return c


# Random ops: big enough for statistics; compared by shape, dtype and (mean, std, zeros).
N_RANDOM = 4096


def random_calls():
    calls = [
        Call("bernoulli.p", dict(self=torch.zeros(N_RANDOM), p=0.25)),
        Call("native_dropout", dict(input=torch.ones(N_RANDOM), p=0.25, train=True)),
        Call("normal.Tensor_float", dict(mean=torch.zeros(N_RANDOM), std=1.0)),
        Call("normal.float_Tensor", dict(mean=0.5, std=torch.ones(N_RANDOM))),
        Call("normal.float_float", dict(mean=0.5, std=1.0, size=[N_RANDOM], device=CPU)),
        Call("normal_", dict(self=torch.zeros(N_RANDOM), mean=0.5, std=1.0)),
        Call("uniform", dict(self=torch.zeros(N_RANDOM), **{"from": -1.0, "to": 1.0})),
        Call("exponential", dict(self=torch.zeros(N_RANDOM), lambd=0.5)),
    ]
    for c in calls:
        c.where = "random"
    return calls


# Ops without a CPU kernel: checked against what CPU computes for the same user call.
def _sdpa(arg, v):
    """F.scaled_dot_product_attention(scale=v) forward and backward (4-d inputs take the
    overrideable fused route on tpu) vs CPU's."""
    q, k, val, ct = (make((1, 2, 4, 8), seed=i) for i in range(4))
    seen = set()

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(_func_name(func))
            return func(*args, **(kwargs or {}))

    def on(device):
        t = [a.to(device).requires_grad_() for a in (q, k, val)]
        with Seen():
            o = torch.nn.functional.scaled_dot_product_attention(*t, scale=v)
            grads = torch.autograd.grad((o * ct.to(device)).sum(), t)
        return o.detach(), list(grads)
    expected = on("cpu")
    seen.clear()
    actual = on("tpu")
    assert {"_scaled_dot_product_fused_attention_overrideable",
            "_scaled_dot_product_fused_attention_overrideable_backward"} <= seen, sorted(seen)
    return actual, expected


CUSTOM = {"_scaled_dot_product_fused_attention_overrideable": _sdpa,
          "_scaled_dot_product_fused_attention_overrideable_backward": _sdpa}


# ---- deriving in-place and out= forms -------------------------------------------------------

RELATED = {"_native_batch_norm_legit_functional": "native_batch_norm",
           "_batch_norm_with_update": "native_batch_norm",
           "_batch_norm_with_update_functional": "native_batch_norm",
           "_batch_norm_no_update": "native_batch_norm",
           "_native_batch_norm_legit_no_training": "native_batch_norm",
           "_native_batch_norm_legit": "native_batch_norm"}


def _result_parts(out):
    if isinstance(out, tuple):
        return list(out)
    return [out]


def derive(target, src):
    """Calls of `target` made of `src`'s arguments by name (none if they do not fit). Out
    arguments: empty tensors of src's result dtypes (the resize path), then tensors shaped
    like the results (some CPU out= kernels do not resize)."""
    if src.name == target:
        return [src]
    src_types = {a.name: str(a.type) for a in src.schema.arguments}
    values, outs = {}, []
    for a in _overload(target)._schema.arguments:
        if a.is_out:
            outs.append(a)
            continue
        if a.name in src.values and src_types.get(a.name) == str(a.type):
            values[a.name] = src.values[a.name]
        elif not a.has_default_value() and not str(a.type).startswith("Optional"):
            return []
    where = f"{src.where}: {src.name}"
    if not outs:
        return [Call(target, values, where)]
    try:
        res, _ = run(src, "cpu")
    except Exception:
        return []
    parts = _result_parts(res)
    if not src.schema.returns or len(parts) < len(outs):
        return []
    calls = []
    for resize in (True, False) if any(str(a.type) == "Tensor" for a in outs) else (False,):
        v = dict(values)
        for a, r in zip(outs, parts):
            if str(a.type) == "Tensor" and isinstance(r, torch.Tensor):
                v[a.name] = torch.empty(0, dtype=r.dtype) if resize else torch.empty_like(r)
            elif str(a.type) == "List[Tensor]" and isinstance(r, (list, tuple)):
                v[a.name] = [torch.empty_like(t) for t in r]
            else:
                return []
        calls.append(Call(target, v, where))
    return calls


# ---- choosing a call per float argument -----------------------------------------------------

def _same(a, b):
    """CPU results equal (NaNs in the same places count as equal)."""
    la, lb = pytree.tree_leaves(a), pytree.tree_leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            try:
                torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
            except AssertionError:
                return False
        elif x != y:
            return False
    return True


def choose(target, arg, candidates, random, values=_values):
    """(call, informative): the first candidate that runs on CPU with both values and whose
    results differ (informative); else the first that runs; None if none runs."""
    v1, v2 = values(target, arg)
    fallback = None
    for call in (c for src in candidates for c in derive(target, src)):
        try:
            r1 = run(call.with_value(arg, v1), "cpu")
            r2 = run(call.with_value(arg, v2), "cpu")
        except Exception:
            continue
        if random or not _same(r1, r2):
            return call, True
        fallback = fallback or (call, False)
    return fallback


@pytest.fixture(scope="module")
def plans():
    return make_plans(UNIVERSE, _values, _skip_reason)


def make_plans(universe, values, skip_reason):
    """overload -> {arg: (call, informative) or None}, for `universe` less what
    `skip_reason` names; `values(name, arg)` gives the two values (tests/test_int_args.py
    calls this with ints)."""
    families = {_family(n) for n in universe} | set(RELATED.values())
    recorded = record_opinfo_calls(families)
    by_family = {}
    for name, cs in recorded.items():
        by_family.setdefault(_family(name), []).extend(cs)
    for c in hand_calls() + random_calls():
        by_family.setdefault(_family(c.name), []).append(c)
    out = {}
    for name, args in universe.items():
        fam = _family(name)
        cands = by_family.get(fam, []) + by_family.get(RELATED.get(fam, ""), [])
        # the target's own calls first
        cands = [c for c in cands if c.name == name] + [c for c in cands if c.name != name]
        if _is_random(name):  # statistics need the big random_calls() inputs
            cands = [c for c in cands if c.where == "random"]
        out[name] = {arg: None if skip_reason(name, arg) else
                     (Call(name, {}, "custom"), True) if name in CUSTOM else
                     choose(name, arg, cands, _is_random(name), values) for arg in args}
    return out


# ---- comparing ------------------------------------------------------------------------------

def _diff(actual, expected):
    """None when the tpu result matches the CPU one, else a one-line reason."""
    la, lb = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    if len(la) != len(lb):
        return f"{len(la)} results, expected {len(lb)}"
    for i, (a, e) in enumerate(zip(la, lb)):
        if not isinstance(e, torch.Tensor):
            if a != e and not (isinstance(e, float) and a == pytest.approx(e)):
                return f"[{i}] {a!r} != {e!r}"
            continue
        if not isinstance(a, torch.Tensor) or a.device.type != "tpu":
            return f"[{i}] not a tpu tensor: {a!r}"
        if a.dtype != e.dtype:
            return f"[{i}] dtype {a.dtype} != {e.dtype}"
        if a.shape != e.shape:
            return f"[{i}] shape {tuple(a.shape)} != {tuple(e.shape)}"
        r, t = TOLERANCES.get(e.dtype, (0, 0))
        try:
            torch.testing.assert_close(a.cpu(), e, rtol=r, atol=t, equal_nan=True)
        except AssertionError as err:
            return f"[{i}] values: " + " ".join(str(err).split("\n")[1:3]).strip()
    return None


def _stats(res):
    out = []
    for x in pytree.tree_leaves(res):
        if isinstance(x, torch.Tensor):
            f = x.detach().cpu().double()
            out.append((tuple(x.shape), x.dtype, f.mean().item(), f.std().item(),
                        (f == 0).double().mean().item()))
    return out


def _random_diff(actual, expected):
    """Random results: same shapes and dtypes, and mean, std and fraction of zeros close
    (4096 samples: the margins are > 5 standard errors)."""
    sa, se = _stats(actual), _stats(expected)
    if len(sa) != len(se):
        return f"{len(sa)} results, expected {len(se)}"
    for i, (a, e) in enumerate(zip(sa, se)):
        if a[:2] != e[:2]:
            return f"[{i}] shape/dtype {a[:2]} != {e[:2]}"
        _, _, m, s, z = a
        _, _, em, es, ez = e
        if abs(m - em) > 0.15 * es + 0.03 or abs(s - es) > 0.1 * es + 0.03 or abs(z - ez) > 0.05:
            return f"[{i}] mean/std/zeros {m:.3f}/{s:.3f}/{z:.3f}, CPU {em:.3f}/{es:.3f}/{ez:.3f}"
    return None


def check_arg(name, arg, call, random, values=_values):
    """Failure lines for v1 then v2 of `arg` (empty when both match CPU)."""
    bad = []
    for v in values(name, arg):
        try:
            if name in CUSTOM:
                actual, expected = CUSTOM[name](arg, v)
            else:
                c = call.with_value(arg, v)
                expected = run(c, "cpu")
                actual = run(c, "tpu")
        except Exception as e:
            bad.append(f"{arg}={v}: tpu raised {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        why = (_random_diff if random else _diff)(actual, expected)
        if why:
            bad.append(f"{arg}={v}: {why}  [call from {call.where}]")
    return bad


# ---- tests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(UNIVERSE))
def test_float_arg(name, plans):
    if _skip_reason(name):
        pytest.skip(_skip_reason(name))
    bad, known = [], []
    for arg, plan in plans[name].items():
        if _skip_reason(name, arg):
            continue
        assert plan is not None, f"{name}: no call runs on CPU for {arg}: add one to hand_calls() or SKIP"
        lines = check_arg(name, arg, plan[0], _is_random(name))
        why = _lookup(KNOWN_FAILURES, name, arg, family=False)
        if lines and why:
            known.append(f"{why} ({lines[0]})")
        else:
            bad += lines
    assert not bad, f"{name}:\n  " + "\n  ".join(bad)
    if known:
        pytest.xfail(known[0])


def test_coverage(plans, record_property):
    """Every registry overload with a float argument is exercised, or in SKIP with a reason."""
    missing, exercised, not_informative, skipped = [], 0, [], 0
    for name, args in plans.items():
        if _skip_reason(name):
            skipped += len(args)
            continue
        for arg, plan in args.items():
            if _skip_reason(name, arg):
                skipped += 1
            elif plan is None:
                missing.append(f"{name}/{arg}")
            else:
                exercised += 1
                if not plan[1]:
                    not_informative.append(f"{name}/{arg}")
    print(f"\nfloat arguments: {len(plans)} overloads; (overload, argument) pairs: {exercised} exercised, "
          f"{skipped} skipped; the value changes no CPU result for {len(not_informative)}: "
          f"{', '.join(not_informative)}")
    record_property("float_args_exercised", exercised)
    assert not missing, f"no call for {missing}: add one to hand_calls() or a reason to SKIP"
    assert exercised > 300  # the walk found the registry's ops
    for key in SKIP:
        name = key.split("/")[0]
        assert any(fnmatch.fnmatchcase(n, name) or _family(n) == name for n in UNIVERSE), f"stale entry {key}"
    for key in KNOWN_FAILURES:
        assert any(fnmatch.fnmatchcase(n, key.split("/")[0]) for n in UNIVERSE), f"stale entry {key}"


def test_shape_deciding_floats_fresh_process():
    """The issue's example and arange's other forms, in a fresh process: which program an op
    gets depends on what the process ran before (an op is learned as keyed by value once),
    so the first calls here are the ones that matter. Start and step stay ints: only the
    float end decides the length."""
    code = """if True:
        import json, torch, torch_pjrt
        aten = torch.ops.aten
        calls = [
            ("arange", lambda e, d: torch.arange(e, device=d)),
            ("arange.start", lambda e, d: torch.arange(0, e, device=d)),
            ("arange.start_step", lambda e, d: torch.arange(1, e, 2, device=d)),
            ("arange.out", lambda e, d: aten.arange.out(e, out=torch.empty(0, device=d))),
            ("arange.start_out", lambda e, d: aten.arange.start_out(0, e, 1, out=torch.empty(0, device=d))),
        ]
        bad = []
        for name, f in calls:
            for end in (10.0, 6.0, 13.5):
                got, want = f(end, "tpu").cpu(), f(end, "cpu")
                if got.shape != want.shape or not torch.equal(got, want):
                    bad.append(f"{name} end={end}: shape {tuple(got.shape)}, CPU {tuple(want.shape)}")
        print(json.dumps(bad))
    """
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    bad = json.loads(r.stdout.strip().splitlines()[-1])
    assert not bad, "\n".join(bad)


def test_pow_square_special_case_is_not_reused_for_other_exponents():
    # pow(t, 2.0) is computed as t * t; with the exponent a runtime input the
    # program that served 2.0 must serve 0.5 too (it once returned t * t).
    code = """
import json, torch, torch_pjrt
out = {}
for dev in ("cpu", "tpu"):
    x, t = torch.arange(1.0, 5, device=dev), torch.tensor(10.0, device=dev)
    x.pow(3.0)
    out[dev] = [t.pow(e).item() for e in (2.0, 0.5, 0.25, 2.0, -1.5)]
print("RESULT " + json.dumps(out))
"""
    out = run_json(code)
    assert out["tpu"] == pytest.approx(out["cpu"], rel=1e-6)
