"""Python ints as runtime scalars in eager mode (strict and fused).

An int passed for a `Scalar` argument (x.clamp(max=n), x.fill_(n), masked_fill(m, n),
add(alpha=n)) and an integer CPU scalar tensor (x + n wraps n into one) are runtime
program inputs, as floats are: one program serves every value (docs/ARCHITECTURE.md,
"Runtime scalars"). An int is keyed by value where it is its argument's schema default
(alpha=1), where it is too large for the scalar pack to carry exactly, for `int` arguments
(dims, sizes), and where the op's lowering or Meta kernel depends on it (learned per
operator, apart from floats).

test_int_arg runs the float-argument harness of tests/test_float_args.py with two int
values per `Scalar` argument of every registry overload: a program built for v1 reused for
v2 would give v1's result. The other tests count programs and check integer dtypes and
CPU's overflow errors.
"""
import json

import pytest
import torch

import test_float_args as fa
import torch_pjrt
from conftest import run_json

SCALAR_TYPES = {"number", "Optional[number]"}


def _int_universe():
    out = {}
    for name, args in fa.UNIVERSE.items():
        schema = fa._overload(name)._schema
        ints = [a.name for a in schema.arguments if a.name in args and str(a.type) in SCALAR_TYPES]
        if ints:
            out[name] = ints
    return out


INT_UNIVERSE = _int_universe()

DEFAULT_VALUES = (3, -2)
# (v1, v2) by argument name, then "family.arg": valid for the op, and apart.
VALUES = {
    "alpha": (2, -3), "beta": (2, 3), "threshold": (1, 2), "exponent": (2, 3), "pow.self": (2, 3),
    "min": (-1, 1), "max": (2, 1), "min_val": (-2, -1), "max_val": (1, 2), "lambd": (1, 2),
    "start": (0, 3), "end": (10, 6), "step": (1, 2), "p": (2, 3), "ord": (2, 3),
    "histc.min": (-1, 0), "histc.max": (1, 2), "bernoulli.p": (0, 1), "renorm.maxnorm": (1, 2),
    "scale": (2, 3), "input_scale": (1, 2), "negative_slope": (2, -1), "weight": (2, -1),
    "value": (3, -2), "other": (3, -2), "delta": (1, 2), "eps": (0, 1), "correction": (0, 1),
}
SKIP = {
    "_foreach_*": "Scalar lists and per-list scalars: ints in them stay keyed (op_instance.cpp)",
    "_fused_*": "optimizer arguments are floats",
    "_amp_*": "floats",
}


def _values(name, arg):
    base = fa._lowering_base(name)
    return VALUES.get(f"{base}.{arg}") or VALUES.get(arg) or DEFAULT_VALUES


def _skip_reason(name, arg=None):
    return fa._lookup(SKIP, name, arg) or fa._skip_reason(name, arg)


@pytest.fixture(scope="module")
def int_plans():
    return fa.make_plans(INT_UNIVERSE, _values, _skip_reason)


@pytest.mark.parametrize("name", list(INT_UNIVERSE))
def test_int_arg(name, int_plans):
    if _skip_reason(name):
        pytest.skip(_skip_reason(name))
    bad, ran = [], 0
    for arg, plan in int_plans[name].items():
        if _skip_reason(name, arg) or plan is None:
            continue  # (no call CPU accepts an int for: counted by test_int_coverage)
        ran += 1
        why = fa._lookup(fa.KNOWN_FAILURES, name, arg, family=False)
        lines = fa.check_arg(name, arg, plan[0], fa._is_random(name), _values)
        if lines and not why:
            bad += lines
    assert not bad, f"{name}:\n  " + "\n  ".join(bad)
    if not ran:
        pytest.skip("CPU accepts no int for its Scalar arguments in the recorded calls")


def test_int_coverage(int_plans):
    exercised = [f"{n}/{a}" for n, args in int_plans.items() if not _skip_reason(n)
                 for a, p in args.items() if p is not None and not _skip_reason(n, a)]
    informative = [f"{n}/{a}" for n, args in int_plans.items() if not _skip_reason(n)
                   for a, p in args.items() if p is not None and p[1] and not _skip_reason(n, a)]
    print(f"\nint Scalar arguments: {len(exercised)} exercised, {len(informative)} with results "
          f"that differ between the two values")
    assert len(informative) > 150


# ---- programs -------------------------------------------------------------------------------

def _count(fn, values):
    """New eager plans (programs) made while fn(v) runs for `values` after three warm-up values."""
    for v in (0, 1, 2):
        fn(v)
    before = torch_pjrt.metrics()["executable_cache_misses"]
    for v in values:
        fn(v)
    torch.tpu.synchronize()
    return torch_pjrt.metrics()["executable_cache_misses"] - before


def _patterns(dev):
    y = torch.zeros(100, 8, device=dev)
    src = torch.arange(800.0, device=dev).reshape(100, 8)
    i64 = torch.arange(12, device=dev)
    u8 = torch.arange(12, dtype=torch.uint8, device=dev)
    m = src > 300
    return {
        "x + n": lambda n: src + n,
        "n - x (int64)": lambda n: n - i64,
        "x * n (uint8, wraps)": lambda n: u8 * n,
        "x < n": lambda n: src < n,
        "x // (n+1) (int64)": lambda n: i64 // (n + 1),
        "x % (n+1) (int64)": lambda n: i64 % (n + 1),
        "clamp(max=n)": lambda n: src.clamp(max=n),
        "clamp_(0, n) (int64)": lambda n: i64.clone().clamp_(0, n),
        "masked_fill(m, n)": lambda n: src.masked_fill(m, n),
        "add(y, alpha=n)": lambda n: src.add(src, alpha=n + 2),
        "fill_(n) (int64)": lambda n: i64.clone().fill_(n),
        "where(m, x, n)": lambda n: torch.where(m, src, n),
        "threshold(x, n, 0)": lambda n: torch.nn.functional.threshold(src, n, 0),
        "hardtanh(x, -|n|, |n|+1)": lambda n: torch.nn.functional.hardtanh(src, -abs(n), abs(n) + 1),
        "full((4,), n) (int64)": lambda n: torch.full((4,), n, device=dev),
        "y[n % 100] += n": lambda n: y.clone()[n % 100].add_(n),
        "eq(x, n) (int64)": lambda n: i64 == n,
    }


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("label", list(_patterns("cpu")))
def test_one_program_for_every_int(label, mode):
    op = _patterns("tpu")[label]

    def f(v):
        if mode == "strict":
            return op(v)
        with torch_pjrt.fused():  # (recorded, run as a trace at the region's end)
            return op(v)
    values = list(range(3, 60)) + [-5, -100, 12345, 2**31 + 7]
    assert _count(f, values) == 0, label
    ref = _patterns("cpu")[label]
    for v in (5, -7, 2**31 + 7):
        torch.testing.assert_close(f(v).cpu(), ref(v), rtol=0, atol=0)


def test_values_beyond_the_pack_stay_exact():
    """Ints the f64 pack cannot carry (beyond 2**53) are keyed by value, exact as on CPU."""
    x = torch.arange(5, dtype=torch.int64)
    t = x.to("tpu")
    for v in (2**53 + 1, 2**60 + 3, -(2**62) - 5, 2**53 + 3):
        assert torch.equal((t + v).cpu(), x + v), v
        assert torch.equal(t.clone().fill_(v).cpu(), x.clone().fill_(v)), v
        assert torch.equal(t.add(t, alpha=v).cpu(), x.add(x, alpha=v)), v


def test_wrapped_ints_wrap_as_cpu_and_scalar_args_raise_as_cpu():
    """x + 300 on uint8 wraps (CPU does not check a wrapped number); fill_(300) raises
    CPU's overflow error on every call, for small and large tensors, after other values
    served the same program (before, a large call was not checked once its plan existed)."""
    for n in (3, 10_000):
        c = torch.zeros(n, dtype=torch.uint8)
        t = c.to("tpu")
        assert torch.equal((t + 300).cpu(), c + 300)
        assert torch.equal((t - 7).cpu(), c - 7)
        for op in (lambda x, v: x.clone().fill_(v), lambda x, v: x.masked_fill(x == 0, v),
                   lambda x, v: x.clamp(max=v)):
            for ok in (1, 2, -1, 255, -255):
                assert torch.equal(op(t, ok).cpu(), op(c, ok)), ok
            for bad in (256, 300, -256, 1000):
                with pytest.raises(RuntimeError, match="value cannot be converted to type uint8_t without overflow"):
                    op(c, bad)
                with pytest.raises(RuntimeError, match="value cannot be converted to type uint8_t without overflow"):
                    op(t, bad)
        i8 = torch.zeros(n, dtype=torch.int8, device="tpu")
        i8.fill_(5)
        with pytest.raises(RuntimeError, match="int8_t without overflow"):
            i8.fill_(128)
        assert i8.fill_(-128).cpu()[0].item() == -128
        # a float value too (the same per-call check, now learned for large calls)
        u = torch.zeros(n, dtype=torch.uint8, device="tpu")
        u.fill_(1.0)
        with pytest.raises(RuntimeError, match="uint8_t without overflow"):
            u.fill_(300.0)


def test_int_and_float_modes_are_learned_apart():
    """Whether an op's int calls may take the value at run time is learned apart from its
    float calls (a lowering may read an int exponent where it takes a float one as data):
    two entries, and every value right. Fresh process: what ran before decides."""
    out = run_json("""
import json, torch, torch_pjrt
x = torch.arange(1.0, 6, device="tpu")
k = torch.arange(1, 6, device="tpu")
es = (2, 3, 4, 0.5, 1.5, 2.5, 1, 0)
got = [x.pow(e).cpu().tolist() for e in es] + [k.pow(e).cpu().tolist() for e in es[:3]]
want = [torch.arange(1.0, 6).pow(e).tolist() for e in es] + [torch.arange(1, 6).pow(e).tolist() for e in es[:3]]
modes = torch_pjrt._state.C.float_modes()
print("RESULT " + json.dumps({"got": got, "want": want,
      "int": modes.get("aten::pow.Tensor_Scalar (int)"), "float": modes.get("aten::pow.Tensor_Scalar")}))
""")
    for g, w in zip(out["got"], out["want"]):
        assert g == pytest.approx(w, rel=1e-6)
    assert out["int"] is not None and out["float"] is not None, out


def test_default_alpha_adds_no_input():
    """add(x, y) (alpha=1, its default) keeps alpha a constant: no scalar input; alpha=2
    and alpha=5 share one program that takes it."""
    x = torch.ones(4, device="tpu")
    x + x
    before = torch_pjrt.metrics()["executable_cache_misses"]
    x.add(x, alpha=2)
    x.add(x, alpha=5)
    x.add(x, alpha=-9)
    assert torch_pjrt.metrics()["executable_cache_misses"] - before <= 1
    assert x.add(x, alpha=5).cpu().tolist() == [6.0] * 4
    assert x.add(x).cpu().tolist() == [2.0] * 4


def test_fused_trace_reuses_one_program_for_every_int():
    """A fused region whose ops take a changing int (a decode position) compiles a bounded
    number of fused programs, and its results match CPU."""
    def step(x, pos, dev):
        mask = torch.arange(16, device=dev) < pos + 1
        y = (x * pos + pos).masked_fill(~mask, -1)
        return y.clamp(max=pos * 3).sum()

    xc = torch.arange(16.0)
    xt = xc.to("tpu")
    before = torch_pjrt.metrics()["fused_programs_compiled"]
    for pos in range(40):
        with torch_pjrt.fused():
            got = step(xt, pos, "tpu").item()
        assert got == step(xc, pos, "cpu").item(), pos
    assert torch_pjrt.metrics()["fused_programs_compiled"] - before <= 2


# ---- CPU's value checks of runtime ints (found by fuzzing this change) -----------------------

def _same_outcome(fn, dev_tensors, cpu_tensors, v):
    try:
        want = fn(*cpu_tensors, v)
    except Exception as e:  # noqa: BLE001 - compared by type
        with pytest.raises(type(e)):
            fn(*dev_tensors, v)
        return
    torch.testing.assert_close(fn(*dev_tensors, v).cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32])
def test_sub_alpha_overflow_is_cpus_negated_check(dtype):
    """sub computes x + (-alpha) * y: CPU checks -alpha, so int8 alpha=128 works and
    alpha=-128 raises (a check of alpha itself would do the reverse)."""
    lim = torch.iinfo(dtype).max + 1
    x, y = torch.tensor([1, 2], dtype=dtype), torch.tensor([1, 1], dtype=dtype)
    xt, yt = x.to("tpu"), y.to("tpu")
    for v in (3, 5, lim, -lim, lim - 1, -lim + 1, 7):
        _same_outcome(lambda a, b, v: a.sub(b, alpha=v), (xt, yt), (x, y), v)
        _same_outcome(lambda a, b, v: torch.rsub(a, 7, alpha=v), (xt, yt), (x, y), v)


def test_value_checks_of_cpus_kernel_at_every_new_int():
    """CPU kernel checks of an int's value (not made by the Meta kernel) raise at the op for
    every value, after other values built the program (and after another dtype taught the
    operator that its ints are runtime inputs)."""
    f = torch.nn.functional
    i8 = torch.tensor([1, 5, 9], dtype=torch.int8)
    u8 = torch.tensor([1, 5, 9], dtype=torch.uint8)
    for lo in (-4, 0, -6, 2, -1):
        _same_outcome(lambda x, v: f.hardtanh(x, v, 7), (i8.to("tpu"),), (i8,), lo)
        _same_outcome(lambda x, v: f.hardtanh(x, v, 7), (u8.to("tpu"),), (u8,), lo)


@pytest.mark.parametrize("op", ["floordiv", "mod", "div_floor", "remainder"])
def test_integer_division_by_a_python_zero_raises_at_the_op(op):
    """i64 // 0 raises CPU's ZeroDivisionError (a RuntimeError) at the op, not at a later
    read, after other divisors built the program; the next op is unaffected."""
    fns = {"floordiv": lambda x, n: x // n, "mod": lambda x, n: x % n,
           "div_floor": lambda x, n: x.div(n, rounding_mode="floor"), "remainder": lambda x, n: x.remainder(n)}
    fn = fns[op]
    x = torch.tensor([4, 7])
    xt = x.to("tpu")
    for n in (3, 5, 0, -2, 0, 4):
        if n == 0:
            with pytest.raises(RuntimeError, match="ZeroDivisionError"):
                fn(xt, n)
            assert (xt + 1).cpu().tolist() == [5, 8]
        else:
            assert torch.equal(fn(xt, n).cpu(), fn(x, n)), n


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_pow_with_large_int_exponents_as_cpu(dtype):
    """CPU takes an int exponent as a double for float32/float64 results (the sign of a
    negative base follows the int's parity: -2 ** (2**31 - 1) is -inf, though 2**31 - 1
    rounds to an even float32) and rounds it to the half type for half results (2049 is
    2048 in float16). Each exponent twice: built, then served by the same program."""
    x = torch.tensor([-2.0, -1.0, -0.5, 0.5, 2.0, -0.0, float("nan"), float("-inf"), -1.0009765625, 1.5],
                     dtype=dtype)
    xt = x.to("tpu")
    rtol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
    for _ in range(2):
        for e in (3, 2**31 - 1, 2**31, 2**24 + 1, -(2**31 - 1), 2**53 - 1, 2049, -2049, -317, 70001, -5):
            try:
                want = x ** e
            except RuntimeError:  # (70001 overflows float16: CPU raises)
                with pytest.raises(RuntimeError):
                    (xt ** e).cpu()
                continue
            got = (xt ** e).cpu()
            torch.testing.assert_close(got, want, rtol=rtol, atol=0, equal_nan=True, msg=f"exponent {e}")
            assert torch.equal(torch.signbit(got), torch.signbit(want)), e
