"""Host (CPU) index tensors on tpu tensors, as CUDA accepts them: x[cpu_mask],
x[cpu_idx], x[cpu_idx] = v, index_put_ with CPU indices; the in-program range
checks still apply. index_select and other ops without `device_check: NoCheck`
raise PyTorch's same-device error, as on CUDA."""
import pytest
import torch

from conftest import assert_same, make, tpu

pytestmark = pytest.mark.usefixtures("no_cpu_fallback")


def both(fn, x, *host):
    """fn(x, *host) on CPU and on tpu(x) with the same (CPU) host tensors."""
    expected = fn(x.clone(), *host)
    actual = fn(tpu(x), *host)
    return actual, expected


def test_cpu_long_index():
    x = make((5, 4))
    idx = torch.tensor([4, 0, -1, 2, 2])
    assert_same(*both(lambda t, i: t[i], x, idx))
    assert_same(*both(lambda t, i: t[i, 1:], x, idx))
    assert_same(*both(lambda t, i: t[:, i[1:4]], x, idx))
    assert_same(*both(lambda t, i: t[i.int()], x, idx))
    assert_same(*both(lambda t, i: torch.ops.aten.index(t, [i]), x, idx))
    assert_same(*both(lambda t, i: torch.ops.aten._unsafe_index(t, [i]), x, idx))


def test_cpu_index_pair_broadcast():
    x = make((4, 5, 3))
    i = torch.tensor([[0], [3]])
    j = torch.tensor([1, 4, 0])
    assert_same(*both(lambda t, a, b: t[a, b], x, i, j))
    assert_same(*both(lambda t, a, b: t[a, :, 1:][:, :, 0], x, i, j))
    # a host index next to a device index
    assert_same(tpu(x)[i, tpu(j)], x[i, j])


def test_cpu_mask():
    x = make((4, 3))
    mask = make((4, 3), torch.bool, seed=3)
    row_mask = torch.tensor([True, False, True, True])
    assert_same(*both(lambda t, m: t[m], x, mask))
    assert_same(*both(lambda t, m: t[m], x, row_mask))
    assert_same(*both(lambda t, m: t[m, 1:], x, row_mask))
    assert_same(*both(lambda t, m: t[:, m[:3]], x, row_mask))
    x3 = make((2, 4, 3))
    assert_same(*both(lambda t, m: t[:, m], x3, mask))
    assert_same(*both(lambda t, m: t[m.to(torch.uint8)], x, mask))


def setitem(t, i, v):
    t[i] = v
    return t


def test_cpu_index_assignment():
    x = make((5, 4))
    idx = torch.tensor([4, 0, -2])
    mask = make((5, 4), torch.bool, seed=4)
    assert_same(*both(lambda t, i: setitem(t, i, 0.5), x, idx))
    assert_same(*both(lambda t, m: setitem(t, m, 0), x, mask))
    nnz = int(mask.sum())
    vals = make((nnz,), seed=5)
    assert_same(setitem(tpu(x), mask, tpu(vals)), setitem(x.clone(), mask, vals))
    row_vals = make((3, 4), seed=6)
    assert_same(setitem(tpu(x), idx, tpu(row_vals)), setitem(x.clone(), idx, row_vals))

    def slice_set(t, i):
        t[i, 1:] = -1.0
        return t
    assert_same(*both(slice_set, x, idx))

    def iadd(t, i):
        t[i] += 1
        return t
    assert_same(*both(iadd, x, idx))


@pytest.mark.parametrize("accumulate", [False, True])
def test_cpu_index_put_(accumulate):
    x = make((6, 3))
    idx = torch.tensor([1, 5, 1, 0]) if accumulate else torch.tensor([1, 5, 0])
    vals = make((idx.numel(), 3), seed=2)
    expected = x.clone().index_put_((idx,), vals, accumulate=accumulate)
    actual = tpu(x).index_put_((idx,), tpu(vals), accumulate=accumulate)
    assert_same(actual, expected)
    expected = torch.index_put(x, (idx,), vals, accumulate)
    assert_same(torch.index_put(tpu(x), (idx,), tpu(vals), accumulate), expected)
    # a CPU mask with accumulate, and a CPU 0-d value (CUDA moves it to the device)
    mask = torch.tensor([True, False, True, False, False, True])
    v = torch.tensor(2.0)
    assert_same(tpu(x).index_put_((mask,), v, accumulate=accumulate),
                x.clone().index_put_((mask,), v, accumulate=accumulate))


def test_cpu_index_grad():
    x = make((5, 3))
    idx = torch.tensor([0, 3, 3])
    xc = x.clone().requires_grad_()
    xt = tpu(x).requires_grad_()
    xc[idx].sum().backward()
    xt[idx].sum().backward()
    assert_same(xt.grad, xc.grad)


def test_cpu_index_checked_in_program():
    # Out of range: CPU raises IndexError at once; the device check raises it
    # at the next host read, as for device indices.
    x = make((3, 4))
    bad = torch.tensor([0, 5])
    with pytest.raises(IndexError):
        x[bad]
    y = tpu(x)[bad]
    with pytest.raises(IndexError):
        y.cpu()
    with pytest.raises(IndexError):
        x.clone()[bad] = 1.0
    t = tpu(x)
    t[torch.tensor([-4])] = 1.0
    with pytest.raises(IndexError):
        torch.tpu.synchronize()
    # the device is usable afterwards
    assert_same(tpu(x)[torch.tensor([2])], x[torch.tensor([2])])


def test_cpu_index_errors_match_cpu():
    x = make((3, 4))
    for fn, idx in [(lambda t, i: t[i], torch.tensor([0.0])),                       # float index
                    (lambda t, i: t[i], torch.tensor([True, False])),               # mask shape
                    (lambda t, i: setitem(t, i, 1.0), torch.tensor([True, False])),
                    (lambda t, i: t[i, i, i], torch.tensor([0]))]:                 # too many indices
        with pytest.raises(Exception) as cpu_err:
            fn(x.clone(), idx)
        with pytest.raises(cpu_err.type):
            fn(tpu(x), idx)
    # a non-0-d CPU value tensor: TensorIterator's same-device error on CUDA too
    with pytest.raises(RuntimeError, match="same device"):
        tpu(x).index_put_((torch.tensor([0, 1]),), torch.ones(2, 4))


def test_ops_without_host_indices_raise():
    # CUDA's index_select, gather, scatter, index_add take no CPU index.
    x = tpu(make((4, 3)))
    idx = torch.tensor([0, 2])
    with pytest.raises(RuntimeError, match="same device"):
        torch.index_select(x, 0, idx)
    with pytest.raises(RuntimeError, match="same device"):
        torch.gather(x, 0, idx.view(2, 1).expand(2, 3))
    with pytest.raises(RuntimeError, match="same device"):
        x.index_add_(0, idx, tpu(make((2, 3))))


def test_compile_with_cpu_index():
    x = make((5, 4))
    idx = torch.tensor([3, 1, 1])

    def f(t, i):
        return t[i] * 2

    fn = torch.compile(f, backend="tpu", fullgraph=False)
    assert_same(fn(tpu(x), idx), f(x, idx))


def test_cpu_mask_with_other_index():
    x = make((4, 3))
    row_mask = torch.tensor([True, False, True, True])
    cols = torch.tensor([0, 2, 1])
    assert_same(*both(lambda t, m, c: t[m, c], x, row_mask, cols))
    assert_same(*both(lambda t, m, c: setitem(t, (m, c), -2.0), x, row_mask, cols))
    # wrong number of values for the mask's nonzeros: raised at the call, as on CPU
    for dev in ["cpu", "tpu"]:
        with pytest.raises(RuntimeError):
            x.clone().to(dev)[row_mask] = torch.ones(2, 3).to(dev)


def test_cpu_mask_needs_no_device_wait(metrics_delta):
    x = tpu(make((64, 8)))
    mask = make((64,), torch.bool, seed=9)
    torch.tpu.synchronize()
    before = metrics_delta()["host_waits"]
    y = x[mask]
    x[mask] = 1.0
    z = x[torch.tensor([1, 2])]
    assert metrics_delta()["host_waits"] == before
    assert_same(y, make((64, 8))[mask])
    assert z.shape == (2, 8)


def test_cpu_index_out_of_range_debug_mode():
    # TORCH_PJRT_EAGER=debug raises at the op itself, as for device indices.
    from conftest import run_python
    r = run_python("import torch, torch_pjrt\n"
                   "x = torch.zeros(3, device='tpu')\n"
                   "try:\n"
                   "    x[torch.tensor([3])]\n"
                   "except IndexError as e:\n"
                   "    print('RAISED', e)\n", TORCH_PJRT_EAGER="debug")
    assert "RAISED" in r.stdout, r.stderr[-2000:]
