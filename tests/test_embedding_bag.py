"""nn.EmbeddingBag / F.embedding_bag on tpu against PyTorch on CPU: sum, mean and max
bags, per-sample weights, padding_idx, include_last_offset, empty bags, NaN/inf and
ties in max mode, and the gradients (weight, per-sample weights, scale_grad_by_freq),
with no CPU fallback."""
import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import assert_same, tpu

# Sums of up to a dozen rows in float32 (CPU adds in another order on its fast path).
TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.bfloat16: (2e-2, 2e-2),
       torch.float16: (2e-3, 2e-3)}

INDICES = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3]
OFFSETS = [0, 4, 4, 9, 15]  # bag 1 is empty; the last runs to the end


def run_both(weight, indices, offsets, grad_seed=2, psw=None, **kw):
    """Forward and backward on CPU and tpu; returns (cpu, tpu) of (output, weight grad, psw grad)."""
    res = []
    for dev in ("cpu", "tpu"):
        w = weight.detach().to(dev).requires_grad_(True)
        p = None if psw is None else psw.detach().to(dev).requires_grad_(True)
        out = F.embedding_bag(indices.to(dev), w, offsets.to(dev), per_sample_weights=p, **kw)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed)).to(weight.dtype)
        out.backward(g.to(dev))
        res.append((out.detach(), w.grad, None if p is None else p.grad))
    return res


def check(res, dtype):
    rtol, atol = TOL[dtype]
    (oc, wc, pc), (ot, wt, pt) = res
    assert_same(ot, oc, rtol=rtol, atol=atol)
    assert_same(wt, wc, rtol=rtol, atol=atol)
    if pc is not None:
        assert_same(pt, pc, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_modes_match_cpu(mode, dtype, padding_idx, no_cpu_fallback):
    weight = torch.randn(10, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
    res = run_both(weight, torch.tensor(INDICES), torch.tensor(OFFSETS), mode=mode, padding_idx=padding_idx)
    check(res, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("padding_idx", [None, 5])
def test_per_sample_weights_and_their_gradient(dtype, padding_idx, no_cpu_fallback):
    weight = torch.randn(10, 4, generator=torch.Generator().manual_seed(1)).to(dtype)
    psw = torch.rand(len(INDICES), generator=torch.Generator().manual_seed(4)).to(dtype)
    res = run_both(weight, torch.tensor(INDICES), torch.tensor(OFFSETS), psw=psw, mode="sum",
                   padding_idx=padding_idx)
    check(res, dtype)


@pytest.mark.parametrize("index_dtypes", [(torch.int32, torch.int32), (torch.int32, torch.int64),
                                          (torch.int64, torch.int32)])
@pytest.mark.parametrize("mode", ["sum", "max"])
def test_index_dtypes_and_include_last_offset(index_dtypes, mode, no_cpu_fallback):
    weight = torch.randn(10, 3, generator=torch.Generator().manual_seed(2))
    idx = torch.tensor(INDICES, dtype=index_dtypes[0])
    off = torch.tensor(OFFSETS + [len(INDICES)], dtype=index_dtypes[1])
    check(run_both(weight, idx, off, mode=mode, include_last_offset=True), torch.float32)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_scale_grad_by_freq_as_cpu(mode, no_cpu_fallback):
    # CPU's kernel divides the g-th distinct value's entries by the count of the g-th
    # sorted index (not always their own value's count); the values here tell them apart.
    weight = torch.randn(10, 3, generator=torch.Generator().manual_seed(3))
    res = run_both(weight, torch.tensor(INDICES), torch.tensor(OFFSETS), mode=mode, scale_grad_by_freq=True)
    check(res, torch.float32)


def test_two_dimensional_input_and_module(no_cpu_fallback):
    bag = torch.nn.EmbeddingBag(12, 6, mode="mean")
    x = torch.tensor([[1, 2, 4, 5], [4, 3, 2, 11], [0, 0, 7, 7]])
    out_c = bag(x)
    bag_t = torch.nn.EmbeddingBag(12, 6, mode="mean").to("tpu")
    bag_t.load_state_dict(bag.state_dict())
    out_t = bag_t(tpu(x))
    assert_same(out_t, out_c, rtol=1e-6, atol=1e-6)
    out_c.sum().backward()
    out_t.sum().backward()
    assert_same(bag_t.weight.grad, bag.weight.grad, rtol=1e-6, atol=1e-6)


def test_max_mode_nan_inf_ties_and_signed_zero(no_cpu_fallback):
    # CPU's loop takes a bag's first entry whatever it is (NaN too) and later ones only
    # when strictly greater: ties keep the first row, a later NaN never wins.
    nan, inf = float("nan"), float("inf")
    weight = torch.tensor([[nan, 1.0], [2.0, -inf], [2.0, nan], [-0.0, 0.0], [0.0, -0.0], [-inf, -inf]])
    idx = torch.tensor([0, 1, 1, 2, 3, 4, 4, 3, 5, 5, 2, 0])
    off = torch.tensor([0, 2, 4, 6, 8, 10])
    (oc, wc, _), (ot, wt, _) = run_both(weight, idx, off, mode="max")
    ot, wt = ot.cpu(), wt.cpu()
    assert torch.equal(ot.isnan(), oc.isnan())
    assert torch.equal(torch.nan_to_num(ot), torch.nan_to_num(oc))
    assert torch.equal(torch.signbit(ot), torch.signbit(oc))
    assert torch.equal(torch.nan_to_num(wt), torch.nan_to_num(wc))
    # Which rows won (the gradient goes to them): compare the raw indices too.
    cpu_rows = torch.ops.aten._embedding_bag(weight, idx, off, False, 2, False, None, False, -1)[3]
    tpu_rows = torch.ops.aten._embedding_bag(tpu(weight), tpu(idx), tpu(off), False, 2, False, None, False, -1)[3]
    assert torch.equal(tpu_rows.cpu(), cpu_rows)


def test_empty_input_and_all_padding_bags(no_cpu_fallback):
    weight = torch.randn(4, 3)
    for mode in ("sum", "mean", "max"):
        out = F.embedding_bag(tpu(torch.tensor([], dtype=torch.long)), tpu(weight),
                              tpu(torch.tensor([0, 0])), mode=mode)
        assert torch.equal(out.cpu(), torch.zeros(2, 3))
        idx, off = torch.tensor([1, 1, 2, 1]), torch.tensor([0, 2])
        c = F.embedding_bag(idx, weight, off, mode=mode, padding_idx=1)
        t = F.embedding_bag(tpu(idx), tpu(weight), tpu(off), mode=mode, padding_idx=1)
        assert_same(t, c)


def test_bad_indices_and_offsets_raise_as_cpu():
    weight = tpu(torch.randn(10, 2))
    for idx in ([-1, 1], [11, 8]):
        with pytest.raises(RuntimeError, match="Expected idx >= 0 && idx < num_embeddings"):
            F.embedding_bag(tpu(torch.tensor(idx)), weight, tpu(torch.tensor([0]))).cpu()
    with pytest.raises(RuntimeError, match=r"offsets\[0\] has to be 0"):
        F.embedding_bag(tpu(torch.tensor([1, 2, 3])), weight, tpu(torch.tensor([1, 2]))).cpu()
    with pytest.raises(RuntimeError, match=r"offsets\[-1\] can not be greater than input's length"):
        F.embedding_bag(tpu(torch.tensor([1, 2, 3])), weight, tpu(torch.tensor([0, 5]))).cpu()
    with pytest.raises(RuntimeError, match="1D or 2D"):
        torch._embedding_bag(weight, tpu(torch.zeros(2, 1, 3, dtype=torch.long)), tpu(torch.tensor([0])))
    torch.tpu.synchronize()
    assert (tpu(torch.ones(2)) * 2).sum().item() == 4.0  # the device keeps working


def test_runs_inside_one_compiled_graph(no_cpu_fallback):
    bag = torch.nn.EmbeddingBag(20, 4, mode="sum")
    idx, off = torch.tensor([1, 5, 7, 7, 19, 0]), torch.tensor([0, 2, 3])
    bag_t = torch.nn.EmbeddingBag(20, 4, mode="sum").to("tpu")
    bag_t.load_state_dict(bag.state_dict())
    fn = torch.compile(lambda i, o: bag_t(i, o) * 2, backend="tpu", fullgraph=True)
    assert_same(fn(tpu(idx), tpu(off)), bag(idx, off) * 2, rtol=1e-6, atol=1e-6)


def test_sparse_gradient_is_refused_with_a_clear_message():
    bag = torch.nn.EmbeddingBag(10, 3, sparse=True, padding_idx=0).to("tpu")
    with pytest.raises(NotImplementedError, match=r"sparse=False"):
        bag(tpu(torch.tensor([1, 2, 0, 4])), tpu(torch.tensor([0, 2]))).sum().backward()
    with torch.no_grad():  # no gradient: the forward alone runs
        out = bag(tpu(torch.tensor([1, 2, 0, 4])), tpu(torch.tensor([0, 2])))
    assert out.shape == (2, 3)
