"""PyTorch view and in-place semantics on tpu: every case is replayed on CPU
and the whole base tensor compared afterwards."""
import pytest
import torch

from conftest import assert_same, make, tpu


def replay(fn, *inputs):
    """Runs fn on CPU copies and tpu copies of `inputs`; compares all inputs and the result."""
    cpu_in = [x.clone() for x in inputs]
    tpu_in = [tpu(x) for x in inputs]
    expected = fn(*cpu_in)
    actual = fn(*tpu_in)
    for a, e in zip(tpu_in, cpu_in):
        assert_same(a, e)
    if isinstance(expected, torch.Tensor):
        assert_same(actual, expected)
    return actual


def test_view_shares_storage():
    t = tpu(torch.arange(12.0))
    v = t.view(3, 4)
    assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    v[1, 2] = 100.0
    assert t[6].item() == 100.0


@pytest.mark.parametrize("case", [
    lambda x: x[1].add_(5),
    lambda x: x[:, 1].mul_(3),
    lambda x: x.t()[2].fill_(-1),
    lambda x: x[1:3, ::2].sub_(2.5),
    lambda x: x.view(-1)[3:9:2].zero_(),
    lambda x: x.transpose(0, 1)[1:4, :2].add_(x.transpose(0, 1)[:3, 2:4]),
    lambda x: x.unsqueeze(0)[0, 2].div_(4),
    lambda x: x.narrow(1, 1, 2).copy_(torch.ones(4, 2, device=x.device)),
    lambda x: x.select(1, 3).add_(x.select(1, 0)),
])
def test_inplace_on_view_updates_base(case):
    replay(case, make((4, 5)))


def test_as_strided_and_storage_offset():
    def fn(x):
        v = x.as_strided((3, 2), (4, 1), 2)
        v.mul_(10)
        return x.as_strided((2, 2), (1, 3), 1) + 0
    replay(fn, make((16,)))


def test_overlapping_as_strided_read():
    # Overlapping windows (stride smaller than extent) take the gather path.
    replay(lambda x: x.as_strided((4, 3), (1, 1), 0) * 2, make((10,)))
    replay(lambda x: x.unfold(0, 4, 2) + 1, make((11,)))


def test_write_through_expanded_view_is_rejected():
    x = tpu(torch.zeros(3))
    with pytest.raises(RuntimeError, match="more than one element"):
        x.expand(4, 3).add_(1)


def test_noncontiguous_inputs():
    a = make((5, 6), noncontiguous=True)
    b = make((6, 5), seed=1).t()
    replay(lambda x, y: x + y, a, b)
    replay(lambda x: x.permute(1, 0) * 2, make((3, 7)))
    replay(lambda x: x[::-1] if False else x[1::3] - 1, make((10, 2)))


def test_zero_dim_and_empty():
    replay(lambda x: x + 1, torch.tensor(3.5))
    replay(lambda x: x.mul_(2), torch.tensor(2.0))
    replay(lambda x: x + 1, torch.empty(0, 3))
    replay(lambda x: x[2:2].add_(1), make((4,)))
    assert tpu(torch.tensor(7)).item() == 7


def test_type_promotion_and_broadcasting():
    i = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    f = make((3,))
    replay(lambda a, b: a + b, i, f)
    replay(lambda a: a * 2.5, i)
    replay(lambda a: a + 2, i)
    replay(lambda a, b: a / b, i, i + 1)
    replay(lambda a, b: a + b, make((2, 1, 3), dtype=torch.float16), make((4, 1), dtype=torch.float64))
    replay(lambda a: a + torch.tensor(1.5, dtype=torch.float64), make((2, 2)))
    replay(lambda a: a.add_(torch.ones(3, dtype=torch.float64, device=a.device)), make((2, 3)))


def test_inplace_dtype_rules_match_cpu():
    x = tpu(torch.arange(4, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="can't be cast"):
        x.add_(1.5)


def test_out_argument_resizes():
    a, b = make((3, 4)), make((3, 4), seed=2)
    out_cpu = torch.empty(0)
    out_tpu = tpu(torch.empty(0))
    torch.add(a, b, out=out_cpu)
    torch.add(tpu(a), tpu(b), out=out_tpu)
    assert_same(out_tpu, out_cpu)


def test_dtype_views_reinterpret_bytes():
    x = torch.tensor([1.0, -2.0, 0.5])
    replay(lambda t: t.view(torch.int32) + 0, x)
    t = tpu(x)
    t.view(torch.int32).add_(1)
    assert torch.equal(t.cpu(), (x.view(torch.int32) + 1).view(torch.float32))


@pytest.mark.parametrize("fn", [lambda x: x.expand(3, 5).zero_(), lambda x: x.expand(3, 5).fill_(2.5),
                                lambda x: x.unsqueeze(1).expand(5, 4).fill_(-1.0)])
def test_fill_and_zero_on_expanded_views_as_cpu(fn):
    # CPU allows them (one value written everywhere); other in-place ops raise.
    x = make((5,))
    xt = tpu(x)
    fn(x)
    fn(xt)
    assert_same(xt, x)
    with pytest.raises(RuntimeError, match="more than one element"):
        tpu(make((5,))).expand(3, 5).add_(1)


@pytest.mark.parametrize("fn", [
    lambda x: x[1:].copy_(x[:-1]),
    lambda x: x[1:].add_(x[:-1]),
    lambda x: torch.add(x[:-1], 1, out=x[1:]),
    lambda x: x.view(2, 4).index_put_((torch.tensor([1], device=x.device),), x.view(2, 4)[0]),
    lambda x: torch.mul(x[2:], x[:-2], out=x[1:7]),
])
def test_partial_overlap_of_input_and_output_raises_as_on_cpu(fn):
    x = torch.arange(8.0)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        fn(x)
    xt = tpu(torch.arange(8.0))
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        fn(xt)
    assert_same(xt, torch.arange(8.0))  # nothing written


def test_full_and_no_overlap_in_one_storage_still_run():
    for fn in (lambda x: x.add_(x), lambda x: x[:4].add_(x[4:]), lambda x: x[::2].mul_(x[1::2]),
               lambda x: torch.add(x[4:], 1, out=x[:4]), lambda x: x.copy_(x)):
        x = torch.arange(8.0)
        xt = tpu(x)
        fn(x)
        fn(xt)
        assert_same(xt, x)


def test_copy_between_views_with_the_same_lazy_bits():
    """neg(dst) = neg(src) writes src's raw values: equal neg/conj bits cancel."""
    for d in ("cpu", "tpu"):
        src = torch.tensor([1.0, 2.0, 3.0], device=d)
        dst = torch.zeros(3, device=d)
        dst._neg_view().copy_(src._neg_view())
        c = torch.tensor([1 + 2j, 3 - 1j], device=d)
        e = torch.zeros(2, dtype=torch.complex64, device=d)
        e.conj().copy_(c.conj())
        f = torch.zeros(2, dtype=torch.complex64, device=d)
        f.conj().copy_(c)
        got = (dst.cpu().tolist(), e.cpu().tolist(), f.cpu().tolist())
        if d == "cpu":
            expected = got
    assert got == expected


def test_is_set_to():
    t1 = torch.empty(3, 4, device="tpu")
    t3 = torch.tensor([], device="tpu").set_(t1)
    assert t1.is_set_to(t3) and t3.is_set_to(t1)
    assert not t1.is_set_to(torch.empty(3, 4, device="tpu"))
    assert not t1.is_set_to(t1.view(4, 3))
