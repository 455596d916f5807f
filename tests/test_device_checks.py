"""Value checks without debug mode: out-of-range indices and integer division
by zero are checked inside the op's own program and reported at the next host
read or synchronize as the exception CPU raises, naming the op (like CUDA's
device-side asserts); TORCH_PJRT_CHECKS=off turns them off. Float -> integer
casts of NaN/inf/out-of-range values match CPU."""
import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import run_python, tpu

X = torch.arange(15.0).reshape(5, 3)
BAD = torch.tensor([0, 7])


def bad_calls():
    x = tpu(X)
    i = tpu(BAD)
    row = tpu(torch.tensor([[0, 7, 1]]))
    return {
        # name: (call, exception type CPU raises, op named in the message)
        "index_select": (lambda: x.index_select(0, i), IndexError, "index_select"),
        "gather": (lambda: x.gather(0, row), RuntimeError, "gather"),
        "embedding": (lambda: F.embedding(i, x), IndexError, "embedding"),
        "index": (lambda: x[i], IndexError, "aten::index"),
        "index_negative": (lambda: x[tpu(torch.tensor([-6]))], IndexError, "aten::index"),
        "index_put_": (lambda: x.clone().index_put_((i,), tpu(torch.ones(2, 3))), IndexError, "index_put"),
        "setitem": (lambda: x.clone().__setitem__(i, 1.0), IndexError, "index_put"),
        "scatter_": (lambda: x.clone().scatter_(0, row, 1.0), RuntimeError, "scatter"),
        "scatter_add_": (lambda: x.clone().scatter_add_(0, row, tpu(torch.ones(1, 3))), RuntimeError, "scatter_add"),
        "scatter_reduce_": (lambda: x.clone().scatter_reduce_(0, row, tpu(torch.ones(1, 3)), "amax"),
                            RuntimeError, "scatter_reduce"),
        "index_add_": (lambda: x.clone().index_add_(0, i, tpu(torch.ones(2, 3))), RuntimeError, "index_add"),
        "index_copy_": (lambda: x.clone().index_copy_(0, i, tpu(torch.ones(2, 3))), IndexError, "index_copy"),
        "index_fill_": (lambda: x.clone().index_fill_(0, i, 1.0), IndexError, "index_fill"),
        "cross_entropy": (lambda: F.cross_entropy(tpu(torch.randn(2, 5)), tpu(torch.tensor([7, 1]))),
                          IndexError, "nll_loss"),
        "cross_entropy_negative": (lambda: F.cross_entropy(tpu(torch.randn(2, 5)), tpu(torch.tensor([-3, 1]))),
                                   IndexError, "nll_loss"),
        "nll_loss2d": (lambda: F.nll_loss(tpu(torch.randn(2, 5, 3, 3)), tpu(torch.full((2, 3, 3), 9))),
                       IndexError, "nll_loss2d"),
        "one_hot": (lambda: F.one_hot(tpu(torch.tensor([1, 7])), 5), RuntimeError, "scatter"),
        "floor_divide_by_zero": (lambda: tpu(torch.tensor([5, 3])) // tpu(torch.tensor([0, 1])), RuntimeError,
                                 "floor_divide"),
        "div_trunc_by_zero": (lambda: torch.div(tpu(torch.tensor([5, 3])), tpu(torch.tensor([0, 1])),
                                                rounding_mode="trunc"), RuntimeError, "div"),
        "remainder_by_zero": (lambda: tpu(torch.tensor([5, 3])) % tpu(torch.tensor([0, 1])), RuntimeError,
                              "remainder"),
        # (fmod by a scalar 0 raises at the call, as on CPU: tests/test_cpu_checks.py)
        "uint8_floor_divide": (lambda: tpu(torch.tensor([5, 3], dtype=torch.uint8)) //
                               tpu(torch.tensor([0, 1], dtype=torch.uint8)), RuntimeError, "floor_divide"),
    }


@pytest.mark.parametrize("name", sorted(bad_calls()))
def test_bad_values_raise_cpus_exception_at_next_read(name):
    call, exc, op = bad_calls()[name]
    torch.tpu.synchronize()
    before = torch_pjrt.metrics()["device_check_failures"]
    result = call()  # launched; nothing raised yet (asynchronous)
    with pytest.raises(exc) as e:
        (result if isinstance(result, torch.Tensor) else torch.zeros(1, device="tpu")).cpu()
        torch.tpu.synchronize()
    msg = str(e.value)
    assert op in msg and "torch_pjrt" in msg and "asynchronously" in msg
    assert torch_pjrt.metrics()["device_check_failures"] == before + 1
    # Reported once; the device keeps working and later reads are clean.
    assert (tpu(torch.ones(3)) * 2).sum().item() == 6.0
    torch.tpu.synchronize()


@pytest.mark.parametrize("name", ["index_select", "gather", "scatter_", "floor_divide_by_zero", "cross_entropy"])
def test_cpu_raises_the_same_type(name):
    # The exception types above are CPU's own.
    _, exc, _ = bad_calls()[name]
    x, i, row = X, BAD, torch.tensor([[0, 7, 1]])
    cpu_calls = {
        "index_select": lambda: x.index_select(0, i),
        "gather": lambda: x.gather(0, row),
        "scatter_": lambda: x.clone().scatter_(0, row, 1.0),
        "floor_divide_by_zero": lambda: torch.tensor([5, 3]) // torch.tensor([0, 1]),
        "cross_entropy": lambda: F.cross_entropy(torch.randn(2, 5), torch.tensor([7, 1])),
    }
    with pytest.raises(exc):
        cpu_calls[name]()


def test_valid_values_pass_and_later_ops_are_unaffected():
    x, i = tpu(X), tpu(torch.tensor([4, 0, 2]))
    assert torch.equal(x.index_select(0, i).cpu(), X.index_select(0, torch.tensor([4, 0, 2])))
    assert torch.equal((tpu(torch.tensor([7, -7])) // tpu(torch.tensor([2, 2]))).cpu(), torch.tensor([3, -4]))
    loss = F.cross_entropy(tpu(torch.randn(3, 4)), tpu(torch.tensor([0, 3, -100])))
    assert torch.isfinite(loss.cpu())


def test_the_first_failure_is_reported_and_the_word_resets():
    x = tpu(X)
    bad = x.index_select(0, tpu(BAD))  # IndexError
    x.gather(0, tpu(torch.tensor([[9, 0, 0]])))  # RuntimeError, later
    with pytest.raises(IndexError):
        bad.cpu()
    x.cpu()  # the second failure was part of the same report: the word is clean now
    torch.tpu.synchronize()


def test_checks_inside_a_compiled_graph():
    f = torch.compile(lambda t, idx: t.index_select(0, idx) * 2, backend="tpu")
    x = tpu(X)
    assert torch.equal(f(x, tpu(torch.tensor([1, 2]))).cpu(), X.index_select(0, torch.tensor([1, 2])) * 2)
    out = f(x, tpu(BAD))
    with pytest.raises(IndexError, match="compiled graph"):
        out.cpu()


def test_checks_off_gives_xla_semantics():
    p = run_python(r"""
import torch, torch_pjrt
x = torch.arange(15.).reshape(5, 3).to("tpu")
print("ROW", x.index_select(0, torch.tensor([7]).to("tpu")).cpu().tolist())
print("DIV", (torch.tensor([5]).to("tpu") // torch.tensor([0]).to("tpu")).cpu().tolist())
""", TORCH_PJRT_CHECKS="off")
    assert p.returncode == 0, p.stderr
    assert "ROW [[12.0, 13.0, 14.0]]" in p.stdout  # XLA clamps to the last row


def test_debug_mode_raises_at_the_op():
    p = run_python(r"""
import torch, torch_pjrt
x = torch.arange(15.).reshape(5, 3).to("tpu")
try:
    x.index_select(0, torch.tensor([7]).to("tpu"))
    print("NOT RAISED")
except IndexError as e:
    print("RAISED", e)
""", TORCH_PJRT_EAGER="debug")
    assert p.returncode == 0, p.stderr
    assert "RAISED" in p.stdout and "asynchronously" not in p.stdout


def test_bad_checks_setting_is_a_clear_error():
    p = run_python("import torch, torch_pjrt\ntorch.ones(2).to('tpu').index_select(0, torch.tensor([0]).to('tpu'))",
                   TORCH_PJRT_CHECKS="maybe")
    assert p.returncode != 0 and "TORCH_PJRT_CHECKS" in p.stderr


SPECIAL = [float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 1e20, -1.5, 300.7, -300.7, 70000.5, 2.5, -0.0]


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dst", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool])
def test_float_to_int_casts_match_cpu(src, dst):
    x = torch.tensor(SPECIAL, dtype=src)
    assert torch.equal(tpu(x).to(dst).cpu(), x.to(dst))
    # through an op's type conversion too (result written into an int tensor)
    out = torch.zeros(len(SPECIAL), dtype=dst)
    out_t = tpu(out)
    out_t.copy_(tpu(x))
    assert torch.equal(out_t.cpu(), out.copy_(x))


def test_checks_switch_at_run_time():
    x, i = tpu(X), tpu(torch.tensor([7]))
    f = torch.compile(lambda a, b: a.index_select(0, b) + 0, backend="tpu")
    try:
        torch_pjrt.set_checks(False)
        assert not torch_pjrt.checks_enabled()
        assert x.index_select(0, i).cpu().tolist() == [[12.0, 13.0, 14.0]]  # XLA clamps
        assert f(x, i).cpu().tolist() == [[12.0, 13.0, 14.0]]
    finally:
        torch_pjrt.set_checks(True)
    with pytest.raises(IndexError):
        x.index_select(0, i).cpu()
    with pytest.raises(IndexError, match="compiled graph"):
        f(x, i).cpu()


@pytest.mark.parametrize("name", ["scatter", "index_put_", "index_select"])
def test_a_read_of_an_empty_result_reports_its_failed_check(name):
    # The op's result is empty, so reading it read nothing: the failure was
    # raised by the next, unrelated read instead.
    bad = {
        "scatter": lambda: torch.zeros(0, device="tpu").scatter(0, tpu(torch.tensor(0)), 3.0),
        "index_put_": lambda: torch.zeros(0, 2, device="tpu").index_put_((tpu(torch.tensor([1])),), tpu(torch.tensor(1.0))),
        "index_select": lambda: torch.zeros(2, 0, device="tpu").index_select(0, tpu(torch.tensor([5]))),
    }[name]
    with pytest.raises((RuntimeError, IndexError), match="out of"):
        bad().cpu()
    assert (torch.ones(2, device="tpu") * 2).cpu().tolist() == [2.0, 2.0]


def _asserting(x):
    torch._assert_async((x < 10).all(), "x must be < 10")
    return x * 2


@pytest.mark.parametrize("device", ["tpu", "cpu"])
def test_assert_async_holds_in_compiled_graphs(device):
    # It was dropped from compiled graphs (PyTorch checks only its size
    # assertions while tracing): a failing one returned [2, 40]. On tpu it is
    # a device check raised at the host read; on CPU inputs the host runs it.
    torch._dynamo.reset()
    f = torch.compile(_asserting, backend="tpu")
    assert f(torch.tensor([1.0, 2.0], device=device)).cpu().tolist() == [2.0, 4.0]
    with pytest.raises(RuntimeError, match="x must be < 10"):
        f(torch.tensor([1.0, 20.0], device=device)).cpu()
    assert f(torch.tensor([3.0, 4.0], device=device)).cpu().tolist() == [6.0, 8.0]
    with pytest.raises(RuntimeError, match="x must be < 10"):
        _asserting(torch.tensor([1.0, 20.0]))  # (CPU eager, the reference)


def test_assert_async_in_eager_raises_at_the_read_and_at_the_op_in_debug_mode():
    x = tpu(torch.tensor([1.0, 20.0]))
    torch._assert_async((x > 0).all(), "positive")  # holds
    torch._assert_async((x < 10).all(), "x must be < 10")
    with pytest.raises(RuntimeError, match="x must be < 10"):
        (x + 1).cpu()
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        torch._assert_async(x < 10)  # as CPU: a shape error at the call
    r = run_python("""
import torch, torch_pjrt
x = torch.tensor([0.0], device="tpu").sum()
try:
    torch._assert_async(x)
except RuntimeError as e:
    print("raised at the op:", e)
""", TORCH_PJRT_EAGER="debug")
    assert "raised at the op" in r.stdout and "single nonzero value" in r.stdout, r.stdout + r.stderr
