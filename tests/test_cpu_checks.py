"""Checks PyTorch's CPU kernels make that its Meta kernels lack: a dtype an op
does not implement, a Python scalar that does not fit the op's dtype, an out=
dtype the op refuses. The tpu backend raises the exception type CPU raises
(each case runs on CPU first, so the test follows PyTorch), in strict and in
fused eager mode, and computes the valid neighbours of each case as CPU does.
The CPU kernel is asked for calls of at most 4096 elements; larger calls are
asked in a shrunk form, whose failure counts when the same call with other
dtypes does not fail (float16/bfloat16 calls are not: a known limit,
docs/results.md)."""
import pytest
import torch
import torch_pjrt

from conftest import assert_same

b = lambda d: torch.tensor([True, False, True], device=d)
i = lambda d: torch.tensor([1, 5, 2], device=d)
f = lambda d: torch.tensor([1.5, 2.0], device=d)
i8 = lambda d: torch.zeros(2, dtype=torch.int8, device=d)
h = lambda d: torch.zeros(2, dtype=torch.float16, device=d)
mask = lambda d: torch.tensor([True, False], device=d)


def run(fn, device, fused):
    """fn on `device`; its result read back inside the mode (a fused trace runs there)."""
    if fused:
        with torch_pjrt.fused():
            r = fn(device)
            if isinstance(r, torch.Tensor):
                r.cpu()
            return r
    r = fn(device)
    if isinstance(r, torch.Tensor):
        r.cpu()
    return r


def same_outcome(fn, fused):
    try:
        expected = fn("cpu")
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)) as err:
            run(fn, "tpu", fused)
        assert type(err.value) is type(e), (type(err.value), err.value)
        return err.value
    actual = run(fn, "tpu", fused)
    assert_same(actual, expected)
    return None


# ---- #10: a scalar that does not fit the dtype the CPU kernel converts it to ----
OVERFLOW = {
    "uint8.fill_(256)": lambda d: torch.zeros(2, dtype=torch.uint8, device=d).fill_(256),
    "full(-129, int8)": lambda d: torch.full((2,), -129, dtype=torch.int8, device=d),
    "int32.fill_(2**40)": lambda d: torch.zeros(2, dtype=torch.int32, device=d).fill_(2**40),
    "int64.fill_(nan)": lambda d: torch.zeros(2, dtype=torch.int64, device=d).fill_(float("nan")),
    "int8.fill_(127.9)": lambda d: i8(d).fill_(127.9),
    "float16.fill_(1e5)": lambda d: h(d).fill_(1e5),
    "float32.fill_(1e39)": lambda d: torch.zeros(2, device=d).fill_(1e39),
    "uint8.masked_fill(300)": lambda d: torch.zeros(2, dtype=torch.uint8, device=d).masked_fill(mask(d), 300),
    "where(c, int8, 1000)": lambda d: torch.where(mask(d), i8(d), 1000),
    "int8.clamp(min=-1000)": lambda d: i8(d).clamp(min=-1000),
    "float16.clamp(max=1e5)": lambda d: h(d).clamp(max=1e5),
    "int16 ** 2**31": lambda d: torch.ones(2, dtype=torch.int16, device=d) ** 2**31,
    "float16 ** 1e5": lambda d: h(d) ** 1e5,
    "add(int8, int8, alpha=300)": lambda d: torch.add(i8(d), i8(d), alpha=300),
}
# Valid neighbours: CPU promotes, wraps or saturates here instead of raising.
FITS = {
    "uint8.fill_(255)": lambda d: torch.zeros(2, dtype=torch.uint8, device=d).fill_(255),
    "uint8.fill_(-1) wraps": lambda d: torch.zeros(2, dtype=torch.uint8, device=d).fill_(-1),
    "int8.fill_(1.5)": lambda d: i8(d).fill_(1.5),
    "float16.fill_(65504)": lambda d: h(d).fill_(65504.0),
    "float16.fill_(inf)": lambda d: h(d).fill_(float("inf")),
    "float16.fill_(2.5)": lambda d: h(d).fill_(2.5),
    "bool.fill_(2)": lambda d: mask(d).fill_(2),
    "int8 + 1000": lambda d: i8(d) + 1000,
    "int8 == 1000": lambda d: i8(d) == 1000,
    "int8 + 1.5": lambda d: i8(d) + 1.5,
    "float16 + 1e5": lambda d: h(d) + 1e5,
    "where(c, int8, 1.5)": lambda d: torch.where(mask(d), i8(d), 1.5),
    "where(c, float16, 1e5)": lambda d: torch.where(mask(d), h(d), 1e5),
    "int8.clamp(min=-1.5)": lambda d: i8(d).clamp(min=-1.5),
    "int16 ** 2.5": lambda d: torch.ones(2, dtype=torch.int16, device=d) ** 2.5,
    "remainder(int8, 1000)": lambda d: torch.remainder(i8(d), 1000),
    "float16.clamp(max=2.0)": lambda d: h(d).clamp(max=2.0),
}


@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
@pytest.mark.parametrize("name", list(OVERFLOW))
def test_scalar_overflow_raises_as_cpu(name, fused):
    err = same_outcome(OVERFLOW[name], fused)
    assert err is not None and "without overflow" in str(err)


@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
@pytest.mark.parametrize("name", list(FITS))
def test_scalar_that_fits_as_cpu(name, fused):
    same_outcome(FITS[name], fused)


def test_scalar_overflow_after_a_valid_value():
    # A float argument is a runtime input of one program: a later call with a
    # value that does not fit still raises (checked per call, not per program).
    for dt, good, bad in [(torch.float16, 2.5, 1e5), (torch.int64, 3.0, float("nan")), (torch.int8, 3.0, 200.0)]:
        t = torch.zeros(2, dtype=dt, device="tpu")
        for v in (good, good + 1, bad, good):
            fn = lambda d, v=v: torch.zeros(2, dtype=dt, device=d).fill_(v)
            same_outcome(fn, False)
        same_outcome(lambda d: torch.zeros(2, dtype=dt, device=d).clamp(max=bad), False)
        same_outcome(lambda d: torch.zeros(2, dtype=dt, device=d).clamp(max=good), False)


# ---- #11, #12: dtypes CPU does not implement for an op ----
UNSUPPORTED = {
    "abs(bool)": lambda d: torch.abs(b(d)),
    "floor(bool)": lambda d: torch.floor(b(d)),
    "cumsum(bool, out=bool)": lambda d: torch.cumsum(b(d), 0, out=torch.empty(3, dtype=torch.bool, device=d)),
    "median(bool)": lambda d: b(d).median(),
    "kthvalue(bool)": lambda d: b(d).kthvalue(1)[0],
    "mm(bool, bool)": lambda d: torch.mm(b(d)[:, None], b(d)[None]),
    "dot(bool, bool)": lambda d: torch.dot(b(d), b(d)),
    "addcmul(bool)": lambda d: torch.addcmul(b(d), b(d), b(d)),
    "var(int64)": lambda d: i(d).var(),
    "std(int64, dim)": lambda d: i(d).std(0),
    "lerp(int64, int64, 0.5)": lambda d: torch.lerp(i(d), i(d), 0.5),
    "0 - bool": lambda d: 0 - b(d),
    "div(complex, trunc)": lambda d: torch.div(torch.tensor([1 + 1j], device=d), torch.tensor([2 + 0j], device=d),
                                               rounding_mode="trunc"),
    "bitwise_and(float, float)": lambda d: torch.bitwise_and(f(d), f(d)),
    "bitwise_not(float)": lambda d: torch.bitwise_not(f(d)),
    "remainder(bool, bool)": lambda d: torch.remainder(mask(d), mask(d)),
    "fmod(bool, bool)": lambda d: torch.fmod(mask(d), mask(d)),
    "div(bool, bool, trunc)": lambda d: torch.div(mask(d), mask(d), rounding_mode="trunc"),
    "lerp(uint8, uint8, 0.5)": lambda d: torch.lerp(mask(d).to(torch.uint8), mask(d).to(torch.uint8), 0.5),
    "floor_divide(bool, bool)": lambda d: torch.floor_divide(mask(d), mask(d)),
    # Calls of more than 4096 elements: the same call shrunk to at most 4
    # elements per dim fails alike and succeeds with float32 in place of the
    # bool/integer/complex tensors (bool addmv at this size once aborted the
    # process in XLA's dot emitter).
    "addmv(bool, large)": lambda d: torch.addmv(torch.ones(100, dtype=torch.bool, device=d),
                                                torch.ones(100, 100, dtype=torch.bool, device=d),
                                                torch.ones(100, dtype=torch.bool, device=d)),
    "relu(bool, large)": lambda d: torch.relu(torch.ones(5000, dtype=torch.bool, device=d)),
    "softmax(int32, large)": lambda d: torch.softmax(torch.ones(100, 100, dtype=torch.int32, device=d), -1),
    "var(int32, large)": lambda d: torch.ones(5000, dtype=torch.int32, device=d).var(),
    "avg_pool2d(int32, large)": lambda d: torch.nn.functional.avg_pool2d(
        torch.ones(1, 2, 64, 64, dtype=torch.int32, device=d), 2),
    "conv2d(bool, large)": lambda d: torch.nn.functional.conv2d(torch.ones(1, 2, 64, 64, dtype=torch.bool, device=d),
                                                                torch.ones(2, 2, 3, 3, dtype=torch.bool, device=d)),
    "div(complex, trunc, large)": lambda d: torch.div(torch.ones(5000, dtype=torch.complex64, device=d), 2,
                                                      rounding_mode="trunc"),
    "cumsum(bool, dtype=bool, large)": lambda d: torch.cumsum(torch.ones(5000, dtype=torch.bool, device=d), 0,
                                                              dtype=torch.bool),
    # (float tensors: the control call has them as int64)
    "bitwise_and(float, large)": lambda d: torch.bitwise_and(torch.ones(5000, device=d), torch.ones(5000, device=d)),
}
SUPPORTED = {
    "abs(int64)": lambda d: torch.abs(i(d)),
    "floor(int64)": lambda d: torch.floor(i(d)),
    "cumsum(bool)": lambda d: torch.cumsum(b(d), 0),
    "median(int64)": lambda d: i(d).median(),
    "mm(int64)": lambda d: torch.mm(i(d)[:, None], i(d)[None]),
    "var(float)": lambda d: f(d).var(),
    "lerp(float)": lambda d: torch.lerp(f(d), f(d) * 2, 0.5),
    "bitwise_and(bool)": lambda d: torch.bitwise_and(mask(d), mask(d)),
    "remainder(int64)": lambda d: torch.remainder(i(d), i(d)),
    "div(int64, trunc)": lambda d: torch.div(i(d), i(d), rounding_mode="trunc"),
    "bool ** True": lambda d: mask(d) ** True,
    "abs(float, large)": lambda d: torch.ones(300, 300, device=d).abs(),
    # Large calls whose shrunk form fails only for its data or not at all.
    "div(int32, floor, large)": lambda d: torch.div(torch.ones(5000, dtype=torch.int32, device=d),
                                                    torch.arange(5000, dtype=torch.int32, device=d) + 1,
                                                    rounding_mode="floor"),
    "mm(int32, large)": lambda d: torch.ones(100, 100, dtype=torch.int32, device=d) @ torch.ones(
        100, 100, dtype=torch.int32, device=d),
    "index(large)": lambda d: torch.ones(5000, device=d)[torch.arange(4000, device=d)],
    "cumsum(bool, large)": lambda d: torch.ones(5000, dtype=torch.bool, device=d).cumsum(0),
    "embedding(large)": lambda d: torch.nn.functional.embedding(torch.arange(5000, device=d) % 10,
                                                                torch.ones(10, 4, device=d)),
}


@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
@pytest.mark.parametrize("name", list(UNSUPPORTED))
def test_unsupported_dtype_raises_as_cpu(name, fused):
    err = same_outcome(UNSUPPORTED[name], fused)
    assert err is not None
    if isinstance(err, NotImplementedError):
        assert "not implemented for" in str(err) and "tpu" in str(err), str(err)


@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
@pytest.mark.parametrize("name", list(SUPPORTED))
def test_supported_dtype_as_cpu(name, fused):
    same_outcome(SUPPORTED[name], fused)


# ---- #9: out= dtypes CPU refuses ----
OUT_DTYPE = {
    "neg(int64, out=float32)": lambda d: torch.neg(torch.arange(3, device=d), out=torch.empty(3, device=d)),
    "neg(float32, out=float64)": lambda d: torch.neg(torch.arange(3.0, device=d),
                                                     out=torch.empty(3, dtype=torch.float64, device=d)),
    "clamp(float32, out=float16)": lambda d: torch.clamp(torch.arange(3.0, device=d), 0, 1,
                                                         out=torch.empty(3, dtype=torch.float16, device=d)),
    "amax(float32, out=float64)": lambda d: torch.amax(torch.arange(3.0, device=d), 0,
                                                       out=torch.empty((), dtype=torch.float64, device=d)),
    "amax(int64, out=int32)": lambda d: torch.amax(torch.arange(3, device=d), 0,
                                                   out=torch.empty((), dtype=torch.int32, device=d)),
}
OUT_OK = {
    "add(float32, out=float64)": lambda d: torch.add(torch.arange(3.0, device=d), 1,
                                                     out=torch.empty(3, dtype=torch.float64, device=d)),
    "neg(float32, out=float32)": lambda d: torch.neg(torch.arange(3.0, device=d), out=torch.empty(3, device=d)),
    "sum(float32, out=float64)": lambda d: torch.sum(torch.arange(3.0, device=d), 0,
                                                     out=torch.empty((), dtype=torch.float64, device=d)),
}


@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
@pytest.mark.parametrize("name", list(OUT_DTYPE) + list(OUT_OK))
def test_out_dtype_as_cpu(name, fused):
    same_outcome({**OUT_DTYPE, **OUT_OK}[name], fused)


# ---- #5: a complex out= of a real op computes in the inputs' dtype ----
@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
@pytest.mark.parametrize("op", ["sqrt", "log", "exp", "sin"])
def test_complex_out_of_real_op(op, fused):
    fn = getattr(torch, op)
    a = torch.tensor([-2.0, 4.0, 3.0])
    expected = fn(a, out=torch.zeros(3, dtype=torch.complex64))
    out = torch.zeros(3, dtype=torch.complex64, device="tpu")
    if fused:
        with torch_pjrt.fused():
            fn(a.to("tpu"), out=out)
            actual = out.cpu()
    else:
        fn(a.to("tpu"), out=out)
        actual = out.cpu()
    torch.testing.assert_close(actual, expected, equal_nan=True)


def test_scalar_argument_checks_raise_at_the_call():
    # An argument's value CPU's kernel rejects (not a tensor's data): raised at
    # the call with CPU's type, not later by a device check.
    with pytest.raises(RuntimeError, match="ZeroDivisionError") as cpu:
        torch.fmod(torch.tensor([5, 3]), 0)
    x = torch.tensor([5, 3], device="tpu")
    with pytest.raises(type(cpu.value), match="ZeroDivisionError"):
        torch.fmod(x, 0)
    torch.tpu.synchronize()


def test_data_dependent_cpu_errors_are_not_raised():
    # A boolean mask's selection depends on its values: the probe's data must
    # not make a valid call raise.
    x = torch.zeros(40, device="tpu")
    m = torch.arange(40, device="tpu") % 3 == 0
    x[m] = torch.ones(int(m.sum()), device="tpu")
    assert x.sum().item() == 14.0


def test_cpu_checks_can_be_switched_off():
    """TORCH_PJRT_CPU_CHECKS=off: no CPU kernel is asked (the old behaviour,
    an escape hatch); the default raises as CPU."""
    code = ("import torch, torch_pjrt\n"
            "try:\n"
            "    r = torch.zeros(2, dtype=torch.uint8, device='tpu').fill_(256).cpu().tolist()\n"
            "except RuntimeError as e:\n"
            "    r = 'raised' if 'without overflow' in str(e) else str(e)\n"
            "print('RESULT', r)\n")
    from conftest import run_python
    for setting, expected in (("on", "raised"), ("off", "[0, 0]")):
        out = run_python(code, TORCH_PJRT_CPU_CHECKS=setting)
        assert out.returncode == 0, out.stderr[-2000:]
        assert f"RESULT {expected}" in out.stdout, (setting, out.stdout)


# ---- an in-place op's self (or an out= tensor that is also an input) is never resized ----
def _ones(d, *shape):
    return torch.ones(*shape, device=d)


def _mul_out_self(d):
    x = _ones(d, 5, 1)
    return torch.mul(x, _ones(d, 5, 5), out=x)


NOT_RESIZED = {
    # These resized self to [5, 5] on tpu (a Python meta kernel, or PyTorch's
    # generic in-place kernel calling the out= form with self as out).
    "floor_divide_": lambda d: _ones(d, 5, 1).floor_divide_(_ones(d, 5, 5)),
    "ldexp_": lambda d: _ones(d, 5, 1).ldexp_(_ones(d, 5, 5)),
    "mul(x, y, out=x)": _mul_out_self,
    "mul_": lambda d: _ones(d, 5, 1).mul_(_ones(d, 5, 5)),
}
BROADCAST_INTO_SELF = {  # the valid neighbours
    "floor_divide_": lambda d: _ones(d, 5, 5).floor_divide_(_ones(d, 5, 1) * 2),
    "ldexp_": lambda d: _ones(d, 5, 5).ldexp_(_ones(d, 5, 1)),
    "mul(x, y, out=other)": lambda d: torch.mul(_ones(d, 5, 1), _ones(d, 5, 5), out=torch.empty(0, device=d)),
}


@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
@pytest.mark.parametrize("name", list(NOT_RESIZED))
def test_in_place_self_is_not_resized(name, fused):
    err = same_outcome(NOT_RESIZED[name], fused)
    assert err is not None and "doesn't match the broadcast shape [5, 5]" in str(err)


@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
@pytest.mark.parametrize("name", list(BROADCAST_INTO_SELF))
def test_in_place_broadcast_into_self_as_cpu(name, fused):
    same_outcome(BROADCAST_INTO_SELF[name], fused)


@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
def test_expanded_out_of_the_wrong_size_raises_as_cpu(fused):
    # CPU checks an out= tensor for internal overlap before resizing it; tpu
    # resized the expanded tensor (a new storage) and wrote there.
    def fn(d):
        out = torch.zeros(1, 4, device=d).expand(3, 4)
        return torch.add(torch.ones(5, device=d), 1, out=out)
    err = same_outcome(fn, fused)
    assert err is not None and "more than one element of the written-to tensor" in str(err)


@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
def test_cpu_error_message_starts_as_pytorchs(fused):
    """Tests match PyTorch's message from its start (assertRaisesRegex("^Integer division")):
    torch_pjrt's context comes after it."""
    fn = lambda d: torch.addcdiv(i(d), i(d), i(d))  # noqa: E731
    err = same_outcome(fn, fused)
    assert str(err).startswith("Integer division with addcdiv is no longer supported")
    assert "torch_pjrt: aten::addcdiv on tpu" in str(err)


def test_a_dtype_the_device_lacks_is_named_through_python_operators():
    """NotImplementedError, not TypeError: Tensor.__add__ turns a TypeError into
    NotImplemented, and Python would report 'unsupported operand type(s)'."""
    a = torch.tensor([0.0, 1.0], dtype=torch.float16, device="tpu")
    c = torch.tensor(1, dtype=torch.complex64, device="tpu")  # float16 + complex64 is ComplexHalf
    with pytest.raises(NotImplementedError, match="ComplexHalf is not supported on device tpu"):
        a + c
    with pytest.raises(NotImplementedError, match="Float8_e8m0fnu is not supported on device tpu"):
        torch.ones(2, dtype=torch.float8_e8m0fnu).to("tpu")


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.int64, torch.bool])
def test_addr_scalar_arguments_checked_as_cpu(dtype, fused):
    """addr on tpu is PyTorch's composite, which lacks the CPU (and CUDA)
    kernel's checks of beta and alpha: bool only for bool results, no float
    for integer tensors. Messages and valid neighbours as CPU."""
    def call(beta, alpha):
        def fn(d):
            m = torch.ones(3, 4, dtype=dtype, device=d)
            a, b = torch.ones(3, dtype=dtype, device=d), torch.ones(4, dtype=dtype, device=d)
            return torch.addr(m, a, b, beta=beta, alpha=alpha)
        return fn
    for beta, alpha in [(True, 1), (2, True), (2.0, 1), (2, 1.5), (2, 3), (True, False)]:
        err = same_outcome(call(beta, alpha), fused)
        if err is not None:
            assert str(err).split(" (torch_pjrt")[0] in {
                "Boolean beta only supported for Boolean results.", "Boolean alpha only supported for Boolean results.",
                "For integral input tensors, argument beta must not be a floating point number.",
                "For integral input tensors, argument alpha must not be a floating point number."}, str(err)


@pytest.mark.parametrize("op,grad_shape,input_shape,dim", [
    (torch.ops.aten._adaptive_avg_pool2d_backward, (1, 64, 0, 0), (1, 64, 4, 4), 2),
    (torch.ops.aten._adaptive_avg_pool3d_backward, (1, 0, 0, 0), (1, 4, 4, 4), 1),
])
def test_backward_op_refused_by_meta_gets_cpus_message(op, grad_shape, input_shape, dim):
    # PyTorch's Python Meta kernel words it differently (a run of spaces, a
    # torch.Size); PyTorch's test_adaptive_pooling_empty_output_size matches CPU's.
    want = rf"grad_output has sizes \[{', '.join(map(str, grad_shape))}\] with dimension {dim} being empty"
    with pytest.raises(RuntimeError, match="^" + op.__name__.split(".")[0].lstrip("_") + r"\(\): Expected grad_output "
                       "to have non-zero size for non-batch dimensions, but " + want):
        op(torch.randn(grad_shape, device="tpu"), torch.randn(input_shape, device="tpu"))


OVERLAP = "some elements of the input tensor and the written-to tensor refer to a single memory location"


@pytest.mark.parametrize("name,fn", [
    ("masked_select", lambda x, i: torch.masked_select(x, x > 0, out=x)),
    ("cat", lambda x, i: torch.cat((x[:0], x), out=x)),
    ("gather", lambda x, i: torch.gather(x, 0, i, out=x[:3])),
    ("take", lambda x, i: torch.take(x, i, out=x[:3])),
    ("kthvalue", lambda x, i: torch.kthvalue(x, 2, out=(x[:1].squeeze(), i[:1].squeeze()))),
])
def test_out_overlapping_an_input_raises_as_cpu(name, fn):
    # The CPU probe and the CPU fallback see the call's aliasing (views of one
    # storage view one host copy), so CPU's overlap checks fire.
    for dev in ("cpu", "tpu"):
        x = torch.tensor([1.0, -2.0, 3.0, 4.0, -5.0, 6.0], device=dev)
        with pytest.raises(RuntimeError, match=OVERLAP):
            fn(x, torch.tensor([0, 2, 1], device=dev))



COMPILED_ARGUMENT_ERRORS = [
    # (function, input, CPU's exception type, message part): checks CPU's
    # kernels (or Meta functions compiled graphs skip) make on constant
    # arguments, made by the lowerings so compiled graphs raise them too.
    (lambda t: t ** -1, torch.tensor([1, 2, -1]), RuntimeError, "negative integer powers"),
    (lambda t: t.pow(-2), torch.tensor([7], dtype=torch.uint8), RuntimeError, "negative integer powers"),
    (lambda t: t.clone().fill_(300), torch.zeros(3, dtype=torch.int8), RuntimeError, "int8_t without overflow"),
    (lambda t: torch.full((2,), 300, dtype=torch.int8, device=t.device) + t[:2], torch.zeros(3, dtype=torch.int8),
     RuntimeError, "int8_t without overflow"),
    (lambda t: t.masked_fill(t == 0, -200), torch.zeros(3, dtype=torch.int8), RuntimeError, "int8_t without overflow"),
    (lambda t: t.index_fill(0, torch.tensor([0], device=t.device), 300), torch.zeros(3, dtype=torch.int8),
     RuntimeError, "int8_t without overflow"),
    # clamp's bounds, where's scalar (a scalar_tensor in the graph), add's alpha:
    (lambda t: t.clamp(-257, 257), torch.zeros(3, dtype=torch.uint8), RuntimeError, "uint8_t without overflow"),
    (lambda t: t.clamp_max(1000), torch.zeros(3, dtype=torch.int8), RuntimeError, "int8_t without overflow"),
    (lambda t: t.clamp(max=2**31 + 5), torch.zeros(3, dtype=torch.int32), RuntimeError, "type int without overflow"),
    (lambda t: t.clamp(max=1e6), torch.zeros(3, dtype=torch.float16), RuntimeError, "Half without overflow"),
    (lambda t: torch.where(t > 0, t, 1001), torch.zeros(3, dtype=torch.int8), RuntimeError, "int8_t without overflow"),
    (lambda t: torch.add(t, t, alpha=257), torch.zeros(3, dtype=torch.uint8), RuntimeError, "uint8_t without overflow"),
    # int64: a Python int past 2**63 - 1, a float beyond int64 or NaN (these wrapped to -2**63)
    (lambda t: t.clamp(max=2**63), torch.tensor([1, 2]), RuntimeError, "int64_t without overflow"),
    (lambda t: torch.full((2,), 1e19, dtype=torch.int64, device=t.device) + t, torch.tensor([1, 2]), RuntimeError,
     "int64_t without overflow"),
    (lambda t: torch.full((2,), float("nan"), dtype=torch.int64, device=t.device) + t, torch.tensor([1, 2]),
     RuntimeError, "int64_t without overflow"),
    (lambda t: t.masked_fill(t > 1, 2**63), torch.tensor([1, 2]), RuntimeError, "int64_t without overflow"),
    (lambda t: torch.arange(2**63 - 2, 2**63, device=t.device) + t, torch.tensor([1, 2]), RuntimeError,
     "int64_t without overflow"),
    (lambda t: t[:0].min(0), torch.ones(3, 2), IndexError, "Expected reduction dim 0 to have non-zero size"),
    (lambda t: t[:, :0].max(1), torch.ones(3, 2), IndexError, "Expected reduction dim 1 to have non-zero size"),
]


@pytest.mark.parametrize("case", range(len(COMPILED_ARGUMENT_ERRORS)))
def test_compiled_graphs_raise_cpus_argument_errors(case):
    """Compiled, these gave values (int ** -1 was [1, 0, -1], uint8 7 ** -1
    183, int8 fill_(300) 44, an empty min (inf, 0)) where CPU and eager tpu
    raise."""
    fn, x, exc, part = COMPILED_ARGUMENT_ERRORS[case]
    with pytest.raises(exc, match=part):
        fn(x)
    torch._dynamo.reset()
    with pytest.raises(exc, match=part):
        torch.compile(fn, backend="tpu")(x.to("tpu"))


DTYPE_REFUSALS = {
    "bool remainder": (lambda t: t % t, torch.tensor([True, False])),
    "int logcumsumexp": (lambda t: torch.logcumsumexp(t, 0), torch.tensor([1, 2, 3])),
    "int softmax": (lambda t: torch.softmax(t, 0), torch.tensor([1, 2, 3])),
    "bool linalg_cross": (lambda t: torch.linalg.cross(t, t), torch.tensor([[True, False, True]])),
    "bool scatter_reduce mean": (lambda t: t.scatter_reduce(0, torch.tensor([0, 1], device=t.device), t, "mean"),
                                 torch.tensor([True, False])),
}


@pytest.mark.parametrize("name", list(DTYPE_REFUSALS))
def test_compiled_graphs_raise_cpus_dtype_refusals(name):
    """XLA's verifier rejected these lowerings' StableHLO and the user saw
    MLIR; the graph's ops are now asked on CPU, whose NotImplementedError
    (naming the op and the user's line) is raised instead."""
    fn, x = DTYPE_REFUSALS[name]
    with pytest.raises(NotImplementedError) as cpu:
        fn(x)
    torch._dynamo.reset()
    with pytest.raises(NotImplementedError) as compiled:
        torch.compile(fn, backend="tpu")(x.to("tpu"))
    assert str(cpu.value) in str(compiled.value) and "test_cpu_checks.py" in str(compiled.value)


def test_bool_histc_is_refused_as_on_cpu():
    # (integer histc is computed, as CUDA does; bool is refused on both)
    for dev in ("cpu", "tpu"):
        with pytest.raises(NotImplementedError, match="Bool"):
            torch.histc(torch.tensor([True, False], device=dev), 2).cpu()
    assert torch.histc(torch.tensor([1, 2, 3], device="tpu"), 3).cpu().tolist() == [1, 1, 1]
