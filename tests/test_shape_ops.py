"""Shape ops that move data (cat, stack, flip, roll, repeat, index_select,
gather, tril/triu) and the pure view ops, all compared with PyTorch on CPU."""
import pytest
import torch

from conftest import assert_same, make, tpu

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32,
          torch.int64, torch.uint8, torch.bool]


def check(fn, *inputs):
    assert_same(fn(*tpu(inputs)), fn(*inputs))


# ---- cat / stack --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_cat_dtypes(dtype):
    a, b = make((2, 3), dtype, seed=1), make((4, 3), dtype, seed=2)
    check(lambda a, b: torch.cat([a, b]), a, b)


@pytest.mark.parametrize("shapes,dim", [
    ([(2, 3), (2, 5)], 1),
    ([(2, 3), (2, 5)], -1),
    ([(1, 2, 3), (4, 2, 3), (2, 2, 3)], 0),
    ([(3,)], 0),
    ([(0, 3), (2, 3)], 0),      # empty along the cat dim
    ([(0,), (2, 3)], 0),        # legacy: 1-d empty tensors are skipped
    ([(2, 3), (0,), (1, 3)], 0),
    ([(0,), (0,)], 0),
    ([(2, 0), (2, 0)], 1),
])
def test_cat_shapes(shapes, dim):
    xs = [make(s, seed=i) for i, s in enumerate(shapes)]
    check(lambda *xs: torch.cat(xs, dim), *xs)


def test_cat_noncontiguous():
    a = make((3, 4), noncontiguous=True)
    b = make((2, 3), seed=3).t()  # a transposed layout
    check(lambda a, b: torch.cat([a, b], 1), a, b)


@pytest.mark.parametrize("dts", [(torch.int32, torch.float32), (torch.bool, torch.int64),
                                 (torch.float16, torch.bfloat16), (torch.uint8, torch.int8),
                                 (torch.float32, torch.float64)])
def test_cat_promotes(dts):
    a, b = make((2, 3), dts[0]), make((1, 3), dts[1], seed=5)
    check(lambda a, b: torch.cat([a, b]), a, b)


def test_cat_out():
    a, b = make((2, 3)), make((1, 3), seed=2)
    out = tpu(torch.empty(3, 3))
    torch.cat(tpu([a, b]), out=out)
    assert_same(out, torch.cat([a, b]))


def test_cat_errors():
    a, b = make((2, 3)), make((2, 4))
    with pytest.raises(RuntimeError):
        torch.cat([a, b])
    with pytest.raises(RuntimeError):
        torch.cat(tpu([a, b]))
    with pytest.raises(IndexError):
        torch.cat(tpu([a, a]), 2)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_stack(dim, dtype):
    xs = [make((2, 3), dtype, seed=i) for i in range(3)]
    check(lambda *xs: torch.stack(xs, dim), *xs)


def test_stack_0d_and_hstack_vstack():
    xs = [make((), seed=i) for i in range(4)]
    check(lambda *xs: torch.stack(xs), *xs)
    a, b = make((2, 3)), make((2, 3), seed=1)
    check(lambda a, b: torch.hstack([a, b]), a, b)
    check(lambda a, b: torch.vstack([a, b]), a, b)
    check(lambda a, b: torch.dstack([a, b]), a, b)


# ---- flip / roll / repeat -----------------------------------------------------------------

@pytest.mark.parametrize("shape,dims", [((5,), [0]), ((3, 4), [1]), ((3, 4), [0, 1]),
                                        ((2, 3, 4), [-1, 0]), ((), []), ((3, 4), []),
                                        ((0, 3), [0])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_flip(shape, dims, dtype):
    check(lambda x: x.flip(dims), make(shape, dtype))


def test_flip_noncontiguous_and_helpers():
    x = make((4, 6), noncontiguous=True)
    check(lambda x: x.flip(0, 1), x)
    check(torch.fliplr, x)
    check(torch.flipud, x)
    check(lambda x: torch.rot90(x, 1, [0, 1]), x)


@pytest.mark.parametrize("shape,shifts,dims", [
    ((7,), 2, None), ((7,), -3, None), ((3, 4), 5, None), ((3, 4), 1, 0), ((3, 4), -1, 1),
    ((3, 4), (1, 2), (0, 1)), ((2, 3, 4), (9, -7), (2, 0)), ((3, 4), 0, 1), ((0, 3), 2, 0),
    ((), 3, None),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_roll(shape, shifts, dims, dtype):
    check(lambda x: torch.roll(x, shifts, dims), make(shape, dtype))


def test_roll_noncontiguous():
    check(lambda x: torch.roll(x, 2), make((3, 5), noncontiguous=True))
    check(lambda x: torch.roll(x, (1, -2), (0, 1)), make((3, 5), noncontiguous=True))


@pytest.mark.parametrize("shape,reps", [((3,), (2,)), ((2, 3), (2, 2)), ((2, 3), (1, 2, 1)),
                                        ((), (3,)), ((2, 3), (0, 1))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_repeat(shape, reps, dtype):
    check(lambda x: x.repeat(*reps), make(shape, dtype))


def test_repeat_interleave_and_tile():
    check(lambda x: x.repeat_interleave(2, dim=0), make((2, 3)))
    check(lambda x: torch.tile(x, (2, 1)), make((2, 3), noncontiguous=True))


# ---- index_select / gather ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select(dtype, dim):
    x = make((4, 5), dtype)
    idx = torch.tensor([3, 0, 0, 2, 1])
    check(lambda x, i: x.index_select(dim, i), x, idx)


@pytest.mark.parametrize("xshape,dim,idx", [
    ((4, 5), 0, torch.tensor([], dtype=torch.int64)),
    ((4, 5), 1, torch.tensor(2)),                      # 0-d index
    ((6,), 0, torch.tensor([5, 1, 1], dtype=torch.int32)),
    ((2, 3, 4), 1, torch.tensor([2, 0])),
    ((), 0, torch.tensor([0])),
])
def test_index_select_shapes(xshape, dim, idx):
    check(lambda x, i: torch.index_select(x, dim, i), make(xshape), idx)


def test_index_select_noncontiguous():
    check(lambda x, i: x.index_select(1, i), make((3, 6), noncontiguous=True), torch.tensor([2, 0]))


def test_index_select_error():
    # CPU raises IndexError here; the lowering can only raise RuntimeError.
    with pytest.raises((IndexError, RuntimeError)):
        tpu(make((3, 4))).index_select(0, tpu(torch.tensor([[0, 1]])))
    with pytest.raises(RuntimeError):
        tpu(make((3, 4))).index_select(0, tpu(torch.tensor([0.0])))
    with pytest.raises(IndexError):
        tpu(make((3, 4))).index_select(2, tpu(torch.tensor([0])))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dtype, dim):
    x = make((4, 5), dtype)
    g = torch.Generator().manual_seed(1)
    n = x.shape[dim]
    idx = torch.randint(0, n, (3, 4), generator=g)
    check(lambda x, i: torch.gather(x, dim, i), x, idx)


def test_gather_shapes():
    check(lambda x, i: torch.gather(x, 2, i), make((2, 3, 4)), torch.tensor([[[3, 0]], [[1, 1]]]))
    check(lambda x, i: torch.gather(x, 0, i), make((5,)), torch.tensor([], dtype=torch.int64))
    check(lambda x, i: torch.gather(x, 0, i), make(()), torch.tensor(0))
    check(lambda x, i: x.gather(1, i), make((3, 4), noncontiguous=True), torch.tensor([[3], [0], [2]]))
    check(lambda x, i: torch.take_along_dim(x, i, 1), make((3, 4)), torch.tensor([[3, 1], [0, 0], [2, 1]]))


def test_gather_error():
    with pytest.raises(RuntimeError):
        torch.gather(tpu(make((3, 4))), 1, tpu(torch.tensor([[0, 1]], dtype=torch.float32)))


# ---- tril / triu --------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [torch.tril, torch.triu])
@pytest.mark.parametrize("diagonal", [0, 1, -1, 3, -5])
@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (2, 4, 3), (0, 3)])
def test_tril_triu(fn, diagonal, shape):
    check(lambda x: fn(x, diagonal), make(shape))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.int64, torch.bool])
def test_tril_triu_dtypes(dtype):
    x = make((4, 5), dtype)
    check(torch.tril, x)
    check(lambda x: torch.triu(x, 1), x)
    check(lambda x: x.tril(-1), make((4, 6), dtype, noncontiguous=True))


def test_tril_inplace_and_error():
    x = make((3, 3))
    t = tpu(x)
    t.triu_(1)
    assert_same(t, x.triu(1))
    with pytest.raises(RuntimeError):
        torch.tril(tpu(make((3,))))


# ---- views need no lowering ---------------------------------------------------------------

VIEWS = [
    lambda x: x.view(6, 4), lambda x: x.reshape(-1), lambda x: x.permute(2, 0, 1),
    lambda x: x.transpose(0, 2), lambda x: x[0].t(), lambda x: x.unsqueeze(1).squeeze(1),
    lambda x: x[:, :1].squeeze(), lambda x: x.unsqueeze(-1), lambda x: x[:, :1].expand(2, 5, 4),
    lambda x: x[1:5:2], lambda x: x[..., 1:4:2], lambda x: x.select(2, 1), lambda x: x.narrow(2, 1, 2),
    lambda x: x.split(1, 1), lambda x: x.chunk(2, 2), lambda x: x.unbind(1),
    lambda x: x.permute(1, 2, 0).contiguous(), lambda x: x.clone(),
    lambda x: x.transpose(0, 1).reshape(3, 8), lambda x: x.flatten(1),
    lambda x: x.movedim(0, -1), lambda x: x.unflatten(2, (2, 2)),
]


@pytest.mark.parametrize("i", range(len(VIEWS)))
def test_views(i):
    check(VIEWS[i], make((2, 3, 4)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.int8, torch.bool])
def test_copy_of_noncontiguous(dtype):
    x = make((3, 4), dtype, noncontiguous=True)
    check(lambda x: x.contiguous(), x)
    check(lambda x: x.t().clone(), x)
    check(lambda x: x.t().contiguous().view(-1), x)


@pytest.mark.parametrize("shape,dim,size,step", [((7,), 0, 3, 2), ((4, 9), 1, 4, 1), ((4, 9, 3), -2, 2, 3),
                                                 ((5,), 0, 5, 1), ((6, 4), 0, 2, 4)])
def test_unfold_backward_overlapping_windows(shape, dim, size, step, metrics_delta):
    from conftest import check
    check(lambda x: x.unfold(dim, size, step), make(shape))
    assert metrics_delta()["cpu_fallbacks"] == {}


def test_repeat_interleave_runs_without_fallback(metrics_delta):
    from conftest import check
    check(lambda x: x.repeat_interleave(2, dim=1), make((2, 3, 4)))  # GQA-style key/value repeat
    check(lambda x: torch.repeat_interleave(x, torch.tensor([1, 0, 3]).to(x.device), dim=0), make((3, 4)))
    assert torch.equal(torch.repeat_interleave(torch.tensor([2, 1, 3], device="tpu")).cpu(),
                       torch.repeat_interleave(torch.tensor([2, 1, 3])))
    assert metrics_delta()["cpu_fallbacks"] == {}
