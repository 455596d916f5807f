"""Runs PyTorch's OpInfo samples (common_methods_invocations.op_db) on tpu and on CPU
and classifies every check.  Used by tests/test_opinfo.py (a fixed fast subset) and by
scripts/opinfo_report.py (the full run, writing docs/opinfo.md).

Which OpInfos count ("in scope") -- RULE below, printed in every report:

  direct       the OpInfo's ATen name (OpInfo.aten_name, else its name with a
               "nn.functional."/"linalg."/"special."/"fft." prefix folded into ATen's
               spelling) is in torch_pjrt.supported_ops() (base names; "name.overload"
               entries count for their base name).  Always in scope.
  composite    otherwise, if the forward of its first sample that runs on CPU (dtypes in
               the order asked, float32 first) runs on tpu with zero CPU fallbacks
               (torch_pjrt.metrics()["cpu_fallbacks"] unchanged): PyTorch decomposes it
               into lowered ops.  In scope; that probe is its first check.
  not lowered  otherwise, if the probe needed a CPU fallback: only the probe runs, and the
               ATen ops that fell back are listed.  Not counted.
  unsupported  otherwise, if the probe stops with "dtype Complex*/UInt16-64 is not
               supported on device tpu" (the device has no such dtypes).  Not counted.
  skipped      sparse-layout OpInfos, and random / undefined-output ones (OpInfo skips
               TestCommon.test_compare_cpu as non-deterministic or undefined, or the name
               says rand*/dropout/normal/bernoulli/empty...): nothing to compare.

Each (sample, dtype) gives a forward check and, for ops with autograd on that dtype, a
gradient check (backward of sum(output * fixed random cotangent), input grads compared).
Each check is one of: pass, mismatch (values/dtype/shape differ), error (tpu raised, CPU
did not), fallback (some op ran on CPU through the fallback: not a pass even when the
values agree).  Samples the CPU itself rejects are skipped.  Index outputs of sort-like
ops (TIE_OPS) pass when they select the same values (ties); their gradient checks are
skipped when the grads differ and the input has repeated values (routing among ties is
order-dependent).  The pass rate is pass / (pass + mismatch + error + fallback) over the
checks of in-scope (direct + composite) ops.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
import time
import types
import unittest
import warnings

import torch
import torch.utils._pytree as pytree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import torch_pjrt  # noqa: E402  (registers the tpu device before the test internals load)

DEVICE = "tpu"

RULE = __doc__[__doc__.index("Which OpInfos"):].strip()

# Same per-dtype tolerances as tests/conftest.py (kept in sync by test_opinfo.py).
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.complex64: (1e-5, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
INT_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
               "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
               "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
               "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
               "complex64": torch.complex64, "complex128": torch.complex128}

# Random or undefined-valued ops that OpInfo does not already mark as skipped for
# TestCommon.test_compare_cpu.
_NONDETERMINISTIC = re.compile(
    r"(^|\.|_)(rand|randn|randint|randperm|bernoulli|multinomial|normal|uniform|exponential|"
    r"geometric|cauchy|log_normal|poisson|dropout\w*|alpha_dropout|feature_alpha_dropout|rrelu|"
    r"gumbel_softmax|fractional_max_pool\w*|empty\w*|new_empty\w*)($|\.|_like)")

STATUSES = ("pass", "mismatch", "error", "fallback")
# Builds without complex or wide unsigned dtypes: a composite OpInfo whose probe stops
# on one of these is "unsupported", not a lowering failure.
_UNSUPPORTED = re.compile(r"dtype (Complex\w*|UInt(16|32|64)) is not supported on device")


# ---- op_db ------------------------------------------------------------------------------------

def _install_expecttest_shim():
    """common_utils imports expecttest only for its TestCase base class; the pinned
    requirements do not include it, so an equivalent stand-in is enough here."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        m = types.ModuleType("expecttest")
        m.TestCase = unittest.TestCase
        sys.modules["expecttest"] = m


_OP_DB = None


def load_op_db():
    """PyTorch's OpInfo list (imports torch.testing._internal; ~10 s)."""
    global _OP_DB
    if _OP_DB is None:
        _install_expecttest_shim()
        argv = sys.argv
        sys.argv = argv[:1]  # common_utils parses sys.argv at import
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from torch.testing._internal.common_methods_invocations import op_db
        finally:
            sys.argv = argv
        _OP_DB = list(op_db)
    return _OP_DB


def op_key(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def find_ops(names):
    by_key = {op_key(op): op for op in load_op_db()}
    missing = [n for n in names if n not in by_key]
    if missing:
        raise KeyError(f"no OpInfo named {missing}")
    return [by_key[n] for n in names]


def registry_names():
    return {n.split(".")[0] for n in torch_pjrt.supported_ops()}


def aten_names(op):
    """Candidate ATen base names of an OpInfo."""
    names = set()
    if getattr(op, "aten_name", None):
        names.add(op.aten_name)
    n = op.name
    for prefix, repl in (("nn.functional.", ""), ("linalg.", "linalg_"), ("special.", "special_"),
                         ("fft.", "fft_"), ("_refs.", "")):
        if n.startswith(prefix):
            n = repl + n[len(prefix):]
    names.add(n.replace(".", "_"))
    return names


def is_direct(op, registry):
    return bool(aten_names(op) & registry)


def _skip_reason(dec):
    for cell in getattr(dec, "__closure__", None) or ():
        if isinstance(cell.cell_contents, str):
            return cell.cell_contents
    return "skipped"


def compare_cpu_skip(op, dtype):
    """The reason OpInfo gives for skipping TestCommon.test_compare_cpu (random or
    undefined outputs), or None."""
    for d in op.decorators:
        if not hasattr(d, "is_active"):
            continue
        try:
            active = d.is_active("TestCommon", "test_compare_cpu", DEVICE, dtype, {})
        except Exception:
            active = False
        if not active or d.test_name != "test_compare_cpu":
            continue
        for dec in d.decorators:
            if "skip" in getattr(dec, "__qualname__", ""):
                why = _skip_reason(dec)
                if re.search(r"determinis|undefined|random", why, re.I):
                    return "OpInfo: " + why
    return None


# OpInfos skipped by OpInfo for only some of their samples: those samples are skipped here,
# the rest run (predicate True = run the sample).
SAMPLE_FILTERS = {
    "nn.functional.scaled_dot_product_attention":
        (lambda s: not s.kwargs.get("dropout_p", 0.0), "dropout_p > 0 is random"),
    "unique": (lambda s: s.kwargs.get("sorted", True), "order undefined when sorted=False"),
}


def nondeterministic_reason(op):
    if op.name in SAMPLE_FILTERS:
        return None
    r = compare_cpu_skip(op, torch.float32)
    if r:
        return r
    name = op.name
    if name.startswith("signal.") or name.endswith("_backward"):  # windows, dropout's backward
        return None
    if _NONDETERMINISTIC.search(name):
        return "random or undefined output"
    return None


def tolerance(op, dtype):
    """conftest's (rtol, atol) for the dtype, loosened to any toleranceOverride the
    OpInfo declares for TestCommon.test_compare_cpu."""
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    for d in op.decorators:
        if not hasattr(d, "is_active") or d.test_name != "test_compare_cpu":
            continue
        try:
            if not d.is_active("TestCommon", "test_compare_cpu", DEVICE, dtype, {}):
                continue
        except Exception:
            continue
        for dec in d.decorators:
            over = getattr(dec, "d", None)
            if isinstance(over, dict) and dtype in over:
                atol = max(atol, over[dtype].atol)
                rtol = max(rtol, over[dtype].rtol)
    return rtol, atol


def dtypes_for(op, wanted):
    """The wanted dtypes the OpInfo supports on CPU, in the order given."""
    supported = op.supported_dtypes("cpu")
    return [d for d in wanted if d in supported]


# ---- running one sample -------------------------------------------------------------------------

def _to_tpu(x, grad):
    if isinstance(x, torch.Tensor):
        t = x.detach().to(DEVICE)
        if grad and x.requires_grad:
            t.requires_grad_(True)
        return t
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device(DEVICE)
    if isinstance(x, str) and x in ("cpu", "cpu:0"):  # a device argument ("to", factories)
        return DEVICE
    return x


def _keep_on_cpu(x, grad):
    return _to_cpu_copy(x, grad)


def _to_cpu_copy(x, grad):
    if isinstance(x, torch.Tensor):
        t = x.detach().clone()
        if grad and x.requires_grad:
            t.requires_grad_(True)
        return t
    return x


def _move_sample(sample, fn, grad, args_fn=None):
    """(input, args, kwargs) of a sample with fn applied to every leaf (args_fn, when
    given, to args and kwargs)."""
    args_fn = args_fn or fn
    inp = pytree.tree_map(lambda x: fn(x, grad), sample.input)
    args = pytree.tree_map(lambda x: args_fn(x, grad), sample.args)
    kwargs = pytree.tree_map(lambda x: args_fn(x, grad), sample.kwargs)
    if fn is _to_tpu and isinstance(kwargs, dict) and kwargs.get("device") in ("cpu", torch.device("cpu")):
        kwargs = dict(kwargs, device=DEVICE)
    return inp, args, kwargs


def _fallbacks():
    return dict(torch_pjrt.metrics()["cpu_fallbacks"])


def _fallback_delta(before):
    now = _fallbacks()
    return sorted(op for op, n in now.items() if n != before.get(op, 0))


def _first_line(e):
    msg = str(e).strip().splitlines()
    line = msg[0] if msg else ""
    if len(line) > 200:
        line = line[:197] + "..."
    return f"{type(e).__name__}: {line}"


def _max_abs_diff(a, e):
    try:
        a64, e64 = a.detach().cpu().to(torch.float64), e.detach().to(torch.float64)
        if a64.shape != e64.shape:
            return float("nan")
        both_nan = torch.isnan(a64) & torch.isnan(e64)
        d = (a64 - e64).abs()
        d = torch.where(both_nan, torch.zeros_like(d), d)
        d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)
        return d.max().item() if d.numel() else 0.0
    except Exception:
        return float("nan")


def compare(actual, expected, rtol, atol, what="output"):
    """None when the tpu result matches the CPU one, else a one-line reason."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if len(a_leaves) != len(e_leaves):
        return f"{what}: {len(a_leaves)} results, expected {len(e_leaves)}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        where = what if len(e_leaves) == 1 else f"{what}[{i}]"
        if e is None or a is None:
            if (e is None) != (a is None):
                return f"{where}: {'None' if a is None else 'a value'} where CPU gives " \
                       f"{'None' if e is None else 'a value'}"
            continue
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"{where}: {type(a).__name__}, expected a tensor"
            if a.device.type != DEVICE and e.device.type == "cpu":
                return f"{where}: result on {a.device}, expected {DEVICE}"
            if a.dtype != e.dtype:
                return f"{where}: dtype {a.dtype} != {e.dtype}"
            if a.shape != e.shape:
                return f"{where}: shape {tuple(a.shape)} != {tuple(e.shape)}"
            ac = a.detach().cpu()
            if e.is_floating_point() or e.is_complex():
                r, t = TOLERANCES.get(e.dtype, (0.0, 0.0))
                r, t = max(r, rtol), max(t, atol)
            else:
                r, t = 0.0, 0.0
            try:
                torch.testing.assert_close(ac, e.detach(), rtol=r, atol=t, equal_nan=True,
                                           check_device=False, check_layout=False)
            except AssertionError:
                n_bad = _count_bad(ac, e.detach(), r, t)
                return f"{where}: max abs diff {_max_abs_diff(ac, e):.3g} " \
                       f"({n_bad}/{e.numel()} elements, {e.dtype})"
        elif isinstance(e, float):
            if not isinstance(a, (int, float)) or not (
                    (math.isnan(e) and math.isnan(a)) or math.isclose(a, e, rel_tol=max(rtol, 1e-6),
                                                                      abs_tol=max(atol, 1e-6))):
                return f"{where}: {a!r} != {e!r}"
        else:
            if a != e:
                return f"{where}: {a!r} != {e!r}"
    return None


def _count_bad(a, e, rtol, atol):
    try:
        if a.is_floating_point() or e.is_floating_point():
            a64, e64 = a.to(torch.float64), e.to(torch.float64)
            ok = torch.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
        else:
            ok = a == e
        return int((~ok).sum().item())
    except Exception:
        return -1


def _cotangents(out, seed=1234):
    g = torch.Generator().manual_seed(seed)
    cts = []
    for leaf in pytree.tree_leaves(out):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad and leaf.is_floating_point():
            cts.append(torch.randn(leaf.shape, generator=g, dtype=torch.float32).to(leaf.dtype))
        else:
            cts.append(None)
    return cts


def _grads(out, leaves, cts, device):
    terms = []
    for leaf, ct in zip(pytree.tree_leaves(out), cts):
        if ct is not None:
            terms.append((leaf * ct.to(device)).sum())
    if not terms:
        return None
    loss = terms[0]
    for t in terms[1:]:
        loss = loss + t
    return torch.autograd.grad(loss, leaves, allow_unused=True)


def _grad_leaves(moved):
    return [x for x in pytree.tree_leaves(moved) if isinstance(x, torch.Tensor) and x.requires_grad]


@dataclasses.dataclass
class Check:
    op: str
    dtype: str
    sample: int
    kind: str          # "fwd" or "grad"
    status: str        # pass | mismatch | error | fallback | skip
    reason: str = ""
    fallbacks: tuple = ()
    ties: bool = False


def _run_sample(op, sample, dtype, kind, rtol, atol, name, index):
    """One check. Returns a Check (status 'skip' when the CPU rejects the sample)."""
    grad = kind == "grad"
    fn = op.op
    dname = str(dtype).replace("torch.", "")

    def mk(status, reason="", fb=()):
        return Check(name, dname, index, kind, status, reason, tuple(fb))

    # CPU reference
    c_in, c_args, c_kwargs = _move_sample(sample, _to_cpu_copy, grad)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = sample.output_process_fn_grad(fn(c_in, *c_args, **c_kwargs)) if grad else \
                fn(c_in, *c_args, **c_kwargs)
            if grad:
                c_leaves = _grad_leaves((c_in, c_args, c_kwargs))
                cts = _cotangents(expected)
                if not c_leaves or all(c is None for c in cts):
                    return mk("skip", "no differentiable input/output")
                expected_grads = _grads(expected, c_leaves, cts, "cpu")
    except Exception as e:  # the CPU rejects it: nothing to compare
        return mk("skip", "CPU: " + _first_line(e))

    # tpu
    before = _fallbacks()
    ties = False

    def on_tpu(args_fn):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t_in, t_args, t_kwargs = _move_sample(sample, _to_tpu, grad, args_fn)
            actual = fn(t_in, *t_args, **t_kwargs)
            if grad:
                actual = sample.output_process_fn_grad(actual)
                t_leaves = _grad_leaves((t_in, t_args, t_kwargs))
                actual_grads = _grads(actual, t_leaves, cts, DEVICE)
                result = compare(actual_grads, expected_grads, rtol, atol, "grad")
                if result and op.name in TIE_OPS and _has_ties(sample.input):
                    return None, True
                return result, False
            result = compare(actual, expected, rtol, atol)
            if result and op.name in TIE_OPS and _tie_equivalent(sample, actual, expected, rtol, atol):
                return None, True
            return result, False

    try:
        try:
            result, ties = on_tpu(None)
        except RuntimeError as e:
            # Index-like arguments PyTorch wants on the CPU (tensor_split's sections) stay there.
            if not re.search(r"to be on cpu|on the CPU", str(e), re.I):
                raise
            result, ties = on_tpu(_keep_on_cpu)
    except Exception as e:
        fb = _fallback_delta(before)
        if fb:
            return mk("fallback", "CPU fallback: " + ", ".join(fb) + " (then " + _first_line(e) + ")", fb)
        return mk("error", _first_line(e))
    fb = _fallback_delta(before)
    if fb:
        return mk("fallback", "CPU fallback: " + ", ".join(fb) + (f" (and {result})" if result else ""), fb)
    if result:
        return mk("mismatch", result)
    if ties and grad:
        return mk("skip", "tied values: gradient routing is order-dependent")
    ch = mk("pass", "indices differ only among equal values" if ties else "")
    ch.ties = ties
    return ch


# Ops returning indices of values (sort-like): with equal values any of the tied indices is
# right, so an index output that differs from the CPU's is accepted when it selects the same
# values; the gradient of such a sample is then not compared (it routes to other elements).
TIE_OPS = {"sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode",
           "max", "min", "argmax", "argmin", "cummax", "cummin", "aminmax", "unique",
           "unique_consecutive", "nn.functional.max_pool1d", "nn.functional.max_pool2d",
           "nn.functional.max_pool3d", "nn.functional.adaptive_max_pool1d",
           "nn.functional.adaptive_max_pool2d", "nn.functional.adaptive_max_pool3d",
           "max_pool2d_with_indices_backward"}


def _has_ties(x):
    return isinstance(x, torch.Tensor) and x.numel() > 1 and \
        torch.unique(x.detach()).numel() < x.numel()


def _tie_equivalent(sample, actual, expected, rtol, atol):
    """True when the outputs agree except for int64 index outputs whose entries pick, from
    sample.input along some dim, the same values as the CPU's indices."""
    x = sample.input
    if not isinstance(x, torch.Tensor):
        return False
    x = x.detach()
    a_leaves = pytree.tree_leaves(actual)
    e_leaves = pytree.tree_leaves(expected)
    if len(a_leaves) != len(e_leaves):
        return False
    for a, e in zip(a_leaves, e_leaves):
        if compare(a, e, rtol, atol) is None:
            continue
        if not (isinstance(e, torch.Tensor) and e.dtype == torch.int64 and
                isinstance(a, torch.Tensor) and a.dtype == e.dtype and a.shape == e.shape):
            return False
        ia, ie = a.detach().cpu(), e.detach()
        ok = False
        for d in range(max(x.dim(), 1)):
            xa = x if x.dim() else x.reshape(1)
            pa, pe = (ia, ie) if ia.dim() else (ia.reshape(1), ie.reshape(1))
            if pa.dim() == xa.dim() - 1:
                pa, pe = pa.unsqueeze(d), pe.unsqueeze(d)
            if pa.dim() != xa.dim():
                continue
            try:
                va, ve = xa.gather(d, pa), xa.gather(d, pe)
            except (RuntimeError, IndexError):
                continue
            if torch.equal(va, ve) or bool(((va == ve) | (va.isnan() & ve.isnan())).all()):
                ok = True
                break
        if not ok:
            return False
    return True


@dataclasses.dataclass
class OpResult:
    op: str
    scope: str                     # direct | composite | not lowered | skipped
    checks: list
    note: str = ""
    seconds: float = 0.0

    def counts(self):
        c = {s: 0 for s in STATUSES}
        for ch in self.checks:
            if ch.status in c:
                c[ch.status] += 1
        return c


def run_op(op, dtypes, max_samples, grads=True, registry=None, time_cap=None,
           probe_only_if_fallback=True):
    """Runs an OpInfo's samples on tpu vs CPU.

    dtypes: wanted dtypes (those the op supports on CPU are used).
    max_samples: dict dtype -> cap, or an int for all dtypes.
    Returns an OpResult."""
    t0 = time.time()
    name = op_key(op)
    registry = registry_names() if registry is None else registry
    why = nondeterministic_reason(op)
    if why:
        return OpResult(name, "skipped", [], why)
    if op.name.startswith(("sparse.", "to_sparse")):
        return OpResult(name, "skipped", [], "sparse layout (not a tpu layout)")
    direct = is_direct(op, registry)
    scope = "direct" if direct else None
    checks = []
    note = ""
    use = dtypes_for(op, dtypes)
    if not use:
        return OpResult(name, "skipped", [], "none of the dtypes " +
                        ", ".join(str(d).replace("torch.", "") for d in dtypes) + " supported")
    backward = op.supported_backward_dtypes("cpu") if grads and op.supports_autograd else set()
    for dtype in use:
        cap = max_samples.get(dtype, 0) if isinstance(max_samples, dict) else max_samples
        want_grad = dtype in backward and dtype.is_floating_point
        rtol, atol = tolerance(op, dtype)
        torch.manual_seed(0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                samples = op.sample_inputs("cpu", dtype, requires_grad=want_grad)
                taken = 0
                for index, sample in enumerate(samples):
                    if taken >= cap:
                        break
                    if time_cap and time.time() - t0 > time_cap:
                        note = f"time cap {time_cap:.0f} s reached"
                        break
                    keep = SAMPLE_FILTERS.get(op.name)
                    if keep and not keep[0](sample):
                        checks.append(Check(name, str(dtype).replace("torch.", ""), index, "fwd",
                                            "skip", keep[1]))
                        continue
                    ch = _run_sample(op, sample, dtype, "fwd", rtol, atol, name, index)
                    checks.append(ch)
                    if ch.status == "skip":
                        continue
                    taken += 1
                    if scope is None:
                        if ch.status == "fallback" and probe_only_if_fallback:
                            return OpResult(name, "not lowered", checks, ch.reason,
                                            time.time() - t0)
                        if ch.status == "error" and _UNSUPPORTED.search(ch.reason):
                            return OpResult(name, "unsupported", checks, ch.reason,
                                            time.time() - t0)
                        scope = "composite" if ch.status != "fallback" else "not lowered"
                    if want_grad and ch.ties:
                        checks.append(Check(name, ch.dtype, index, "grad", "skip",
                                            "tied values: gradient routing is order-dependent"))
                    elif want_grad:
                        checks.append(_run_sample(op, sample, dtype, "grad", rtol, atol, name, index))
        except Exception as e:  # sample generation itself failed
            note = f"{dtype}: sample_inputs failed: {_first_line(e)}"
        if time_cap and time.time() - t0 > time_cap:
            note = note or f"time cap {time_cap:.0f} s reached"
            break
    if scope is None:
        scope = "skipped"
        note = note or "no sample ran on CPU"
    return OpResult(name, scope, checks, note, time.time() - t0)


def selected_ops(registry=None, include_all=True):
    """All OpInfos (include_all) or only the direct ones."""
    registry = registry_names() if registry is None else registry
    ops = load_op_db()
    return ops if include_all else [op for op in ops if is_direct(op, registry)]
