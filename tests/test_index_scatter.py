"""Advanced indexing, index_put, scatter/gather backward and the index_* family
on tpu vs PyTorch on CPU, forward and backward.

Out-of-range index values: PyTorch raises; on tpu they are checked only in
debug mode (TORCH_PJRT_EAGER=debug, tested in a subprocess below), otherwise
XLA clamps (gather) or drops (scatter) them."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import assert_same, make, tpu, check_raises, check

pytestmark = pytest.mark.filterwarnings("ignore:(index_reduce|The reduce argument).*:UserWarning")

DTYPES = [torch.float32, torch.bfloat16]
SHAPE = (4, 5, 6)


def idx(*values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


def unique_index(shape, dim, size, seed=0):
    """An index for scatter along `dim` without repeats along that dim (deterministic replace)."""
    g = torch.Generator().manual_seed(seed)
    out = torch.empty(shape, dtype=torch.int64)
    moved = out.movedim(dim, -1).reshape(-1, shape[dim])
    for row in moved:
        row.copy_(torch.randperm(size, generator=g)[: shape[dim]])
    return moved.reshape(out.movedim(dim, -1).shape).movedim(-1, dim).contiguous()


def dup_index(shape, size, seed=0):
    return torch.randint(0, size, shape, generator=torch.Generator().manual_seed(seed))


# ---- index.Tensor ------------------------------------------------------------------

i3 = idx(0, -1, 2, 2)            # negative entry and a duplicate (grad accumulates)
j2 = idx([1], [3], [-2])         # broadcasts with i3 to (3, 4)
INDEXINGS = {
    "first": (lambda x, i, j: x[i], ),
    "middle": (lambda x, i, j: x[:, i], ),
    "last_int32": (lambda x, i, j: x[..., i.int()], ),
    "two_adjacent": (lambda x, i, j: x[:, j, i], ),
    "two_split": (lambda x, i, j: x[j, :, i], ),
    "none_and_two": (lambda x, i, j: x[None, :, j, i], ),
    "all_three": (lambda x, i, j: x[i, i, i], ),
    "scalar_and_tensor": (lambda x, i, j: x[1, :, i], ),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(INDEXINGS))
def test_index(name, dtype):
    (fn,) = INDEXINGS[name]
    check(fn, make(SHAPE, dtype), i3, j2)


def test_index_int_dtype_and_noncontiguous():
    fn = INDEXINGS["two_split"][0]
    check(fn, make(SHAPE, torch.int32), i3, j2)
    check(fn, make(SHAPE, torch.bool), i3, j2)
    check(fn, make(SHAPE, noncontiguous=True), i3, j2)
    check(lambda x, i: x[i], make((5,)), torch.tensor(3))  # 0-d index


def test_unsafe_index_and_index_put():
    # The no-check forms used by decompositions (e.g. upsampling) share the lowerings.
    check(lambda x, i, j: torch.ops.aten._unsafe_index(x, [None, j, i]), make(SHAPE), i3, j2)
    check(lambda x, i, v: torch.ops.aten._unsafe_index_put(x, [i], v, True), make(SHAPE), i3, make((6,), seed=1))


def test_index_bad_index_dtype():
    check_raises(lambda x, i: x[i], make(SHAPE), torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize("case", ["empty_broadcast", "empty_broadcast_4d", "empty_slices", "put_empty_broadcast",
                                  "put_empty_slices", "put_accumulate_empty_slices"])
def test_out_of_range_indices_that_touch_nothing_are_not_checked(case):
    # CPU checks an index as it reads or writes an element: none when the
    # broadcast indices or the slices they pick are empty (pytorch/xla's
    # test_index_zero_tensor_by_zero_tensor).
    empty, bad = torch.zeros(0, dtype=torch.long), idx(9)
    fn, x = {
        "empty_broadcast": (lambda x, e, b: x[e, b], make((3, 4))),
        "empty_broadcast_4d": (lambda x, e, b: x[:, e.view(0, 1), :, b.view(1, 1) + 41], make((10, 0, 10, 10))),
        "empty_slices": (lambda x, e, b: x[b + 41], make((10, 0))),
        "put_empty_broadcast": (lambda x, e, b: x.clone().index_put_((e, b), torch.tensor(1.0)), make((3, 4))),
        "put_empty_slices": (lambda x, e, b: x.clone().index_put_((b + 41,), torch.tensor(1.0)), make((10, 0))),
        "put_accumulate_empty_slices": (lambda x, e, b: x.clone().index_put_((b + 41,), torch.tensor(1.0), True),
                                        make((10, 0))),
    }[case]
    expected = fn(x, empty, bad)
    assert_same(fn(tpu(x), tpu(empty), tpu(bad)), expected)
    # ... while one element read is checked.
    with pytest.raises(IndexError, match="out of bounds"):
        tpu(make((3, 4)))[tpu(idx(0)), tpu(bad)].cpu()


def test_index_bool_mask_read():
    check(lambda x: x[x > 0], make(SHAPE))
    check(lambda x: x[:, (x[0] > 0)], make(SHAPE))
    check(lambda x: x[x[:, :1, :1].squeeze(-1).squeeze(-1) > 0, 1:], make(SHAPE))


def test_index_bool_mask_shape_mismatch_raises_index_error():
    x = make(SHAPE)
    mask = torch.ones(SHAPE[0] + 1, dtype=torch.bool)
    with pytest.raises(IndexError):
        x[mask]
    with pytest.raises(IndexError, match="does not match the shape"):
        tpu(x)[tpu(mask)]


# ---- index_put / setitem -------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + [torch.int32])
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(dtype, accumulate):
    x = make(SHAPE, dtype)
    # Unique positions without accumulate (the winner among duplicates is unspecified).
    i = idx(3, 0, -1) if not accumulate else idx(3, 0, 3, -1, 0)
    n = len(i)
    check(lambda x, i, v: x.index_put((i,), v, accumulate), x, i, make((n, 5, 6), dtype, seed=1))
    check(lambda x, i, v: torch.ops.aten.index_put(x, [None, i], v, accumulate), x, i, make((n, 6), dtype, seed=2))
    check(lambda x, i, v: torch.ops.aten.index_put(x, [i, None, i], v, accumulate), x, i, make((n, 5), dtype, seed=3))
    check(lambda x, i, v: x.index_put((i, i), v, accumulate), x, i, make((1,), dtype, seed=4))


@pytest.mark.parametrize("dtype", DTYPES)
def test_setitem(dtype):
    def set_rows(x, i, v):
        y = x.clone()
        y[:, i] = v
        return y
    check(set_rows, make(SHAPE, dtype), idx(4, 0, -2), make((3, 6), dtype, seed=1))

    def add_rows(x, i, v):
        y = x * 1
        y.index_put_((i,), v, accumulate=True)
        return y
    check(add_rows, make(SHAPE, dtype), idx(1, 1, 1, 3), make((6,), dtype, seed=1))  # duplicates


@pytest.mark.parametrize("dtype", DTYPES)
def test_setitem_bool_mask(dtype):
    """x[mask] = v: a lone mask is lowered without nonzero()."""
    x = make(SHAPE, dtype)

    def fill(x):
        y = x.clone()
        y[x > 0] = 2.0
        return y
    check(fill, x)
    m = (x[:, :, 0] > 0).detach()
    n = int(m.sum())

    v = make((20, 6), dtype, seed=1)[:n]

    def rows(x):
        # Only x's grad: v's would be grad[mask], a read with a bool mask (see above).
        y = x.clone()
        y[m.to(x.device)] = v.to(x.device)
        return y
    check(rows, x)
    m2 = x[0] > 0

    v1, v2 = make((4, 1), dtype, seed=2), make((4, 30), dtype, seed=3)[:, : int(m2.sum())]

    def middle(x):
        y = x.clone()
        y[:, m2.to(x.device)] = v1.to(x.device)
        return y
    check(middle, x)
    check(lambda x: torch.ops.aten.index_put(x, [None, m2.to(x.device)], v2.to(x.device), True), x)


# ---- scatter family ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + [torch.int64])
@pytest.mark.parametrize("dim", [0, -1])
def test_scatter_src_and_value(dtype, dim):
    x, src = make(SHAPE, dtype), make((3, 4, 5), dtype, seed=1)
    index = unique_index((3, 4, 4), dim, SHAPE[dim])
    # A src larger than index: forward only (PyTorch's own backward rejects that shape).
    assert_same(tpu(x).scatter(dim, tpu(index), tpu(src)), x.scatter(dim, index, src))
    check(lambda x, i, s: x.scatter(dim, i, s), x, index, src[:, :, :4].contiguous())
    check(lambda x, i: x.scatter(dim, i, 2), x, index)
    dups = dup_index((3, 4, 4), SHAPE[dim])
    # reduce= has no derivative in PyTorch: forward only.
    assert_same(tpu(x).scatter(dim, tpu(dups), tpu(src), reduce="add"), x.scatter(dim, dups, src, reduce="add"))
    value = 1.5 if dtype.is_floating_point else 3
    assert_same(tpu(x).scatter(dim, tpu(dups), value, reduce="multiply"),
                x.scatter(dim, dups, value, reduce="multiply"))


@pytest.mark.parametrize("dtype", DTYPES + [torch.int32])
def test_scatter_add_and_gather_backward(dtype):
    index = dup_index((4, 7, 6), 5)
    check(lambda x, i, s: x.scatter_add(1, i, s), make(SHAPE, dtype), index, make((4, 7, 6), dtype, seed=1))
    if dtype.is_floating_point:
        check(lambda x, i: x.gather(1, i), make(SHAPE, dtype), index)  # backward: scatter_add


@pytest.mark.parametrize("dtype,include_self", [(torch.float32, True), (torch.float32, False),
                                                (torch.bfloat16, True), (torch.bfloat16, False),
                                                (torch.int64, False)])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce(reduce, include_self, dtype):
    x = make(SHAPE, dtype, low=1 if reduce == "prod" else -3, seed=0)
    src = make((4, 8, 6), dtype, low=1 if reduce == "prod" else -3, seed=1)
    index = dup_index((4, 8, 6), 5)
    fn = lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self)  # noqa: E731
    if reduce == "prod" and dtype == torch.bfloat16:
        check(fn, x, index, src, rtol=5e-2, atol=5e-2)  # products of several bf16 roundings
    else:
        check(fn, x, index, src)


def test_scatter_zero_dim_and_empty():
    check(lambda x, i, s: x.scatter(0, i, s), torch.tensor(1.5), torch.tensor(0), torch.tensor(2.5))
    check(lambda x, i, s: x.scatter_add(0, i, s), make((3,)), torch.zeros(0, dtype=torch.long), make((0,)))


def test_scatter_bad_index_dtype():
    check_raises(lambda x, i, s: x.scatter(0, i, s), make((3,)), torch.tensor([0.0]), make((1,)))
    check_raises(lambda x, i, s: x.scatter_add(0, i, s), make((3,)), torch.tensor([0], dtype=torch.int16),
                 make((1,)))
    check(lambda x, i, s: x.scatter_add(0, i, s), make((3,)), torch.tensor([2, 2], dtype=torch.int32), make((2,)))


# ---- index_add / index_copy / index_fill / index_reduce --------------------------------

@pytest.mark.parametrize("dtype", DTYPES + [torch.int64])
@pytest.mark.parametrize("dim", [0, -1])
def test_index_add_copy_fill(dtype, dim):
    x = make(SHAPE, dtype)
    n = SHAPE[dim]
    dups = idx(0, n - 1, 0, 1)
    shape = list(SHAPE)
    shape[dim] = 4
    src = make(shape, dtype, seed=1)
    check(lambda x, i, s: x.index_add(dim, i, s), x, dups, src)
    check(lambda x, i, s: x.index_add(dim, i, s, alpha=2), x, dups.int(), src)
    check(lambda x, i, s: x.index_copy(dim, i, s), x, idx(2, 0, n - 1, 1), src)
    check(lambda x, i: x.index_fill(dim, i, -1), x, idx(0, -1))  # index_fill wraps negatives
    # (no grad for a tensor value: its backward needs _unique, a data-dependent shape)
    v = torch.tensor(3, dtype=dtype)
    check(lambda x, i: x.index_fill(dim, i, v.to(x.device)), x, idx(1, 1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select_backward(dtype):
    check(lambda x, i: x.index_select(1, i), make(SHAPE, dtype), idx(4, 0, 4, 4, 2))  # index_add


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(reduce, include_self):
    x, src = make(SHAPE, low=1), make((4, 3, 6), low=1, seed=1)
    check(lambda x, i, s: x.index_reduce(1, i, s, reduce, include_self=include_self), x, idx(0, 3, 0), src)


def test_index_family_zero_dim_and_bad_input():
    check(lambda x, i, s: x.index_add(0, i, s), torch.tensor(1.0), idx(0), torch.tensor(2.0))
    check(lambda x, i: x.index_fill(0, i, 5.0), torch.tensor(1.0), torch.tensor(0))
    check_raises(lambda x, i, s: x.index_add(0, i, s), make((3, 2)), torch.tensor([0.0]), make((1, 2)))
    check_raises(lambda x, i, s: x.index_copy(0, i, s), make((3, 2)), idx(0, 1), make((3, 2)))


# ---- masked_scatter ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + [torch.int32])
def test_masked_scatter(dtype):
    x = make(SHAPE, dtype)
    mask = make(SHAPE, torch.bool, seed=3)
    check(lambda x, m, s: x.masked_scatter(m, s), x, mask, make((130,), dtype, seed=1))
    check(lambda x, m, s: x.masked_scatter(m, s), x, mask[0, :, :1], make((10, 13), dtype, seed=2))  # broadcast


def test_masked_scatter_bad_mask_dtype():
    check_raises(lambda x, m, s: x.masked_scatter(m, s), make((3,)), make((3,), torch.float32), make((3,)))


# ---- out-of-range indices in debug mode ----------------------------------------------

def test_debug_mode_checks_index_ranges():
    script = textwrap.dedent("""
        import torch, torch_pjrt
        x = torch.zeros(4, 3, device="tpu")
        t = lambda *v: torch.tensor(v, device="tpu")
        cases = {
            "index": lambda: x[t(0, 4)],
            "index_put": lambda: x.index_put((t(-5),), torch.ones(3, device="tpu")),
            "scatter_add": lambda: x.scatter_add(0, t([4, 0, 0]), torch.ones(1, 3, device="tpu")),
            "index_add": lambda: x.index_add(0, t(-1), torch.ones(1, 3, device="tpu")),
            "masked_scatter": lambda: x.masked_scatter(x == 0, torch.ones(5, device="tpu")),
        }
        for name, fn in cases.items():
            try:
                fn().cpu()
                print(name, "no error")
            except (IndexError, RuntimeError) as e:
                print(name, type(e).__name__)
        ok = [x[t(-4, 3)], x.index_fill(0, t(-1), 1.0), x.scatter_add(0, t([3, 0, 0]), torch.ones(1, 3, device="tpu"))]
        print("valid", [r.cpu().shape for r in ok])
    """)
    env = dict(os.environ, TORCH_PJRT_EAGER="debug")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # The exception types CPU raises for each.
    for name, exc in [("index", "IndexError"), ("index_put", "IndexError"), ("scatter_add", "RuntimeError"),
                      ("index_add", "RuntimeError"), ("masked_scatter", "RuntimeError")]:
        assert f"{name} {exc}" in out.stdout, out.stdout
    assert "valid" in out.stdout


# ---- bad indices raise CPU's exception type (found by fuzzing) ------------------------

def _read(fn):
    # Index ranges are checked in the program: the error comes at the host read.
    return lambda *a: fn(*a).cpu()


@pytest.mark.parametrize("case", [
    # more index tensors than dims (a 0-d self crashed the lowering)
    lambda x, i, v: x[0, 0].index_put_((i,), v),
    lambda x, i, v: x[0].index_put_((i, i), v),
    lambda x, i, v: torch.ops.aten.index.Tensor(x[0], [i, i]),
    # a bool mask of the wrong length
    lambda x, i, v: x[0].index_put_((torch.tensor([True, False], device=x.device),), v),
    # a float index, an index into an empty dim, a 2-d index for index_select
    lambda x, i, v: x.index_put_((i.float(),), v),
    lambda x, i, v: x[:, :0].t().index_select(0, i),
    lambda x, i, v: x[0].index_select(0, i.view(1, 1)),
    # a 0-d self: index_select takes one index, 0; gather indices must be 0
    lambda x, i, v: x[0, 0].index_select(0, i + 1),
    lambda x, i, v: x[0, 0].index_select(0, torch.zeros(3, dtype=torch.long, device=x.device)),
    lambda x, i, v: x[0, 0].gather(0, i[0] + 1),
])
def test_bad_indices_raise_cpus_exception_type(case):
    check_raises(_read(case), make((3, 4)), torch.tensor([0]), torch.tensor(2.0))


def test_zero_dim_index_select_and_gather_read_their_one_entry():
    x = torch.tensor(5.0)
    check(lambda x, i: x.index_select(0, i), x, torch.tensor([0]))
    check(lambda x, i: x.gather(0, i), x, torch.tensor(0))
    check(lambda x, i: x.gather(0, i), x, torch.tensor([0, 0]))


def test_set_past_the_storage_end_grows_it_as_on_cpu():
    """set_ with a view beyond the storage's end grows the storage (kept
    contents, the rest zero), so later reads see the same elements as CPU."""
    results = []
    for dev in ("cpu", "tpu"):
        c = torch.arange(8.0, device=dev)
        a = torch.empty(0, device=dev).set_(c.untyped_storage(), 6, (4,), (1,))
        a[2:].fill_(1.0)
        results.append(((a * 1)[:2].cpu(), a.cpu(), c.untyped_storage().nbytes(), c.cpu()))
    for got, expected in zip(results[1], results[0]):
        assert got == expected if isinstance(got, int) else torch.equal(got, expected), (got, expected)


# histc (a scatter-add of ones, scatter.cpp): floats bin as CPU's kernel does
# (exact counts, the elements on the bin edges included); integers, which CPU
# lacks, as CUDA's kernel does. transformers' Mixture-of-Experts layers
# (Mixtral, Qwen2-MoE, DeepSeek-V3, GPT-OSS...) count tokens per expert with
# an integer histc on every device but CPU.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("bins,lo,hi", [(7, -1.3, 0.9), (48, -0.77, 0.99), (5, 0, 0)])
def test_histc_float_matches_cpu(no_cpu_fallback, dtype, bins, lo, hi):
    x = make((300,), dtype=dtype, low=-2, high=2)
    edges = torch.linspace(lo, hi, bins + 1).to(dtype) if lo != hi else x[:4]
    x = torch.cat([x, edges])  # values on the bin edges, where rounding decides the bin
    if lo != hi:
        x = torch.cat([x, torch.tensor([float("nan"), 5.0], dtype=dtype)])  # never counted
    assert_same(torch.histc(tpu(x), bins=bins, min=lo, max=hi), torch.histc(x, bins=bins, min=lo, max=hi),
                rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_integers_count_like_cuda(no_cpu_fallback, dtype):
    x = torch.tensor([0, 0, 1, 3, 3, 3, 5, 2, 7], dtype=dtype)
    out = torch.histc(tpu(x), bins=4, min=0, max=3)
    assert out.dtype == dtype and out.cpu().tolist() == [2, 1, 1, 3]  # 5 and 7 lie outside
    # min == max: the data's range [0, 7]; the bin of v is v * 4 // 7 (7 in the last).
    assert torch.histc(tpu(x), bins=4).cpu().tolist() == [3, 4, 1, 1]
    assert torch.histc(tpu(torch.tensor([5, 5], dtype=dtype)), bins=4).cpu().tolist() == [0, 0, 2, 0]
    # The MoE routing call: tokens per expert, equal to bincount.
    ids = torch.randint(0, 8, (64,), generator=torch.Generator().manual_seed(0)).to(dtype)
    assert torch.histc(tpu(ids), bins=8, min=0, max=7).cpu().tolist() == torch.bincount(ids.long(), minlength=8).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_histc_data_range_is_checked_at_the_call_like_cpu(dtype):
    # min == max: the range comes from the data. CPU raises at the call when
    # it is not finite, naming it; nothing is left pending for a later read.
    for vals in ([float("inf")], [float("-inf")], [1.0, 2.0, float("inf")], [float("nan")]):
        with pytest.raises(RuntimeError) as cpu:
            torch.histc(torch.tensor(vals, dtype=dtype))
        with pytest.raises(RuntimeError) as dev:
            torch.histc(tpu(torch.tensor(vals, dtype=dtype)))
        assert str(cpu.value).split("\n")[0] in str(dev.value), (str(cpu.value), str(dev.value))
    assert (torch.ones(2, device="tpu") * 3).sum().item() == 6.0
    # A constant input is widened by at least one step of its type, as CPU
    # (1e38 - 1 is 1e38): the value lands in the middle bin.
    for v in (5.0, 0.0, 1e38, -3e38):
        x = torch.tensor([v, v], dtype=dtype)
        assert_same(torch.histc(tpu(x), bins=4), torch.histc(x, bins=4), rtol=0, atol=0)


def test_scatter_with_an_empty_index_of_lower_rank():
    # An empty 1-d index into a 2-d self is a no-op on CPU; tpu's program failed to compile.
    x, idx, src = make((2, 3)), torch.tensor([], dtype=torch.long), make((2, 3))
    for fn in (lambda t, i, s: t.scatter(0, i, 3.0), lambda t, i, s: t.scatter_add(0, i, s),
               lambda t, i, s: t.scatter_reduce(0, i, s, "amax"), lambda t, i, s: t.clone().scatter_(0, i, s)):
        assert_same(fn(*tpu((x, idx, src))), fn(x, idx, src))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16])
def test_index_fill_takes_int64_indices_only(dtype):
    # CPU's index_fill (unlike index_add/copy/select) raises IndexError for other index dtypes.
    check_raises(lambda t, i: t.index_fill(0, i, 1.0), make((3,)), torch.tensor([0], dtype=dtype))
    check(lambda t, i: t.index_fill(0, i, 1.0), make((3,)), torch.tensor([0, -1]))


@pytest.mark.parametrize("shape", [(3,), (3, 2)])
def test_index_add_out_of_range_raises_as_cpu(shape):
    # CPU raises IndexError for a 1-d self and RuntimeError otherwise.
    for i in (-1, 3):
        check_raises(lambda t, idx, s: t.index_add_(0, idx, s).cpu(), torch.zeros(shape), torch.tensor([i]),
                     torch.ones((1,) + shape[1:]))


def test_index_select_with_an_empty_result_checks_its_indices():
    # CPU raises for an out-of-range index even when the result is empty
    # (another dim of size 0); tpu returned the empty result.
    x = torch.zeros(2, 0)
    for i in (-3, -1, 2):
        with pytest.raises(RuntimeError, match="out of DATA bounds"):
            torch.index_select(x, 0, torch.tensor([i]))
        with pytest.raises(RuntimeError, match="out of DATA bounds"):
            torch.index_select(tpu(x), 0, tpu(torch.tensor([i])))
            torch.tpu.synchronize()  # (a device-side check: raised at the next read or synchronize)
    assert_same(torch.index_select(tpu(x), 0, tpu(torch.tensor([1, 0]))), torch.index_select(x, 0, torch.tensor([1, 0])))


@pytest.mark.parametrize("case", ["add_empty_self", "add_empty_source", "copy_empty_source", "fill_empty_self"])
def test_slice_writes_with_nothing_to_do_skip_the_index_check_as_cpu(case):
    # CPU's index_add (over more than one dim), index_copy and index_fill do
    # not check indices when self or the source is empty; a 1-d index_add and
    # index_reduce still do (IndexError on both).
    def run(dev):
        i = torch.tensor([5], device=dev)
        z = lambda *s: torch.zeros(*s, device=dev)  # noqa: E731
        if case == "add_empty_self":
            return z(3, 0).index_add_(1, i, torch.ones(3, 1, device=dev))
        if case == "add_empty_source":
            return z(0, 3).index_add_(1, i, torch.ones(0, 1, device=dev))
        if case == "copy_empty_source":
            return z(0, 3).index_copy_(1, i, torch.ones(0, 1, device=dev))
        return z(0, 3).index_fill_(1, i, 1.0)

    want = run("cpu")
    got = run("tpu")
    torch.tpu.synchronize()  # (a failed device check would raise here)
    assert_same(got, want)
    with pytest.raises(IndexError):
        torch.zeros(0, device="tpu").index_add_(0, torch.tensor([5], device="tpu"), torch.ones(1, device="tpu"))
        torch.tpu.synchronize()


def test_gather_from_an_empty_dim_raises_as_cpu():
    # Every index is out of range: CPU's RuntimeError at the op, not a
    # program that fails to compile.
    x = torch.zeros(3, 0)
    i = torch.zeros(3, 1, dtype=torch.long)
    with pytest.raises(RuntimeError, match="out of bounds for dimension 1 with size 0") as e:
        torch.gather(tpu(x), 1, tpu(i))
    assert "compile" not in str(e.value)
    with pytest.raises(RuntimeError, match="out of bounds for dimension 1 with size 0"):
        torch.gather(x, 1, i)


def test_mask_assignment_of_no_values_raises_where_the_mask_selects_some():
    """x[mask] = empty: CPU raises unless the mask selects nothing (it was a silent no-op)."""
    for dev in ("cpu", "tpu"):
        a = torch.arange(4.0, device=dev)
        with pytest.raises(RuntimeError, match="shape mismatch"):
            a[a > -1] = torch.tensor([], device=dev)
            a.cpu()
        a = torch.arange(4.0, device=dev)
        a[a > 10] = torch.tensor([], device=dev)
        assert a.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_uint8_mask_warns_as_cpu():
    import warnings
    counts = {}
    for dev in ("cpu", "tpu"):
        v = torch.arange(5.0, device=dev)
        m = torch.tensor([1, 0, 1, 1, 0], dtype=torch.uint8, device=dev)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = v[m]
            v[m] = torch.zeros(3, device=dev)
        counts[dev] = (sum("torch.uint8 is now deprecated" in str(x.message) for x in w), r.cpu().tolist(),
                       v.cpu().tolist())
    assert counts["tpu"] == counts["cpu"] and counts["cpu"][0] == 2


OVERLAPPING = {
    "index_add_ index": lambda d: (lambda i: i.index_add_(0, i, i.clone()))(torch.tensor([2, 1, 0], device=d)),
    "index_add_ source": lambda d: (lambda x: x.index_add_(0, torch.tensor([0, 1, 2], device=d), x))(
        torch.arange(3.0, device=d)),
    "index_copy_": lambda d: (lambda i: i.index_copy_(0, i, i.clone()))(torch.tensor([2, 1, 0], device=d)),
    "index_fill_": lambda d: (lambda i: i.index_fill_(0, i, 1))(torch.tensor([2, 1, 0], device=d)),
    "index_put_": lambda d: (lambda i: i.index_put_((i,), i.clone()))(torch.tensor([2, 1, 0], device=d)),
    "put_": lambda d: (lambda i: i.put_(i, i.clone()))(torch.tensor([2, 1, 0], device=d)),
    "scatter_": lambda d: (lambda s: s.scatter_(0, torch.tensor([2, 1, 0], device=d), s))(torch.arange(3.0, device=d)),
    "scatter_add_": lambda d: (lambda i: i.scatter_add_(0, i, i.clone()))(torch.tensor([2, 1, 0], device=d)),
}


@pytest.mark.parametrize("name", list(OVERLAPPING))
def test_in_place_index_op_whose_self_overlaps_an_input_raises_as_cpu(name):
    """CPU asserts no overlap at all between self and index/source (not only a
    partial one): the op would read what it writes."""
    fn = OVERLAPPING[name]
    with pytest.raises(RuntimeError, match="unsupported operation"):
        fn("cpu")
    with pytest.raises(RuntimeError, match="unsupported operation"):
        fn("tpu").cpu()


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scatter_and_index_reduce_max_min_propagate_nan(reduce, include_self, dtype):
    nan, inf = float("nan"), float("inf")
    self_ = torch.tensor([0.0, nan, 0.0, 5.0], dtype=dtype)
    src = torch.tensor([1, nan, -inf, -inf, 2, inf], dtype=dtype)
    idx = torch.tensor([0, 0, 1, 1, 2, 2])
    kw = dict(include_self=include_self)
    expected = self_.clone().scatter_reduce_(0, idx, src, reduce, **kw)
    actual = tpu(self_).scatter_reduce_(0, tpu(idx), tpu(src), reduce, **kw)
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)
    expected = self_.clone().index_reduce_(0, idx, src, reduce, **kw)
    actual = tpu(self_).index_reduce_(0, tpu(idx), tpu(src), reduce, **kw)
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_half_scatter_reductions_accumulate_in_float32_as_cpu(dt):
    # CPU's scatter kernels sum float16/bfloat16 in float32 and round once: a
    # bfloat16 sum of 1000 small values into one slot stalled at 8.0 on tpu
    # (10.375 on CPU), and a mean was 3x too large. index_add stays in dt on
    # both.
    g = torch.Generator().manual_seed(0)
    src = (torch.rand(1000, generator=g) * 0.02).to(dt)
    idx = torch.zeros(1000, dtype=torch.long)
    idx[::7] = 1
    s = torch.rand(2, generator=g).to(dt)
    calls = [lambda s, i, x: s.scatter_add(0, i, x),
             lambda s, i, x: s.scatter_reduce(0, i, x, "sum"),
             lambda s, i, x: s.scatter_reduce(0, i, x, "sum", include_self=False),
             lambda s, i, x: s.scatter_reduce(0, i, x, "mean"),
             lambda s, i, x: (s + 1).scatter_reduce(0, i[:100], x[:100] + 1, "prod"),
             lambda s, i, x: s.scatter_reduce(0, i, x, "amax"),
             lambda s, i, x: s.scatter(0, i[:5], 0.3333),
             lambda s, i, x: s.index_add(0, i, x)]
    for f in calls:
        assert_same(f(tpu(s), tpu(idx), tpu(src)), f(s, idx, src), rtol=0, atol=0)


@pytest.mark.parametrize("compiled", [False, True])
def test_index_put_with_a_mask_among_other_index_tensors(compiled):
    """index_put_ with a boolean mask beside an integer index (the ATen call;
    Python's x[i, :, mask] = v already expanded the mask): the mask becomes
    long indices as on CPU (it raised; compiled, the op runs between pieces)."""
    a, i, m, v = make((2, 3, 4)), torch.tensor([0, 2]), torch.tensor([True, False, False, True]), torch.randn([])
    m2 = torch.tensor([[True, False, True], [False, False, True]])
    fns = [lambda a, i, m, m2, v: torch.ops.aten.index_put_(a.clone(), [None, i, m], v, False),
           lambda a, i, m, m2, v: torch.ops.aten.index_put_(a.clone(), [m2, i[:1]], v, True),
           lambda a, i, m, m2, v: torch.ops.aten.index_put(a, [i[:1] - 1, None, m], v * 2)]
    for fn in fns:
        torch._dynamo.reset()
        run = torch.compile(fn, backend="tpu") if compiled else fn
        assert_same(run(*[tpu(t) for t in (a, i, m, m2, v)]), fn(a, i, m, m2, v))
