"""Convolution and pooling on tpu vs PyTorch on CPU, forward and backward.

nn.ConvNd / ConvTransposeNd reach aten::convolution and aten::convolution_backward;
pooling reaches max_pool{2,3}d_with_indices, avg_pool{2,3}d, _adaptive_avg_pool{2,3}d,
adaptive_max_pool{2,3}d and their backward ops (the 1-d variants are composites).
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import assert_same, make, tpu


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def check_autograd(fn, inputs, requires_grad=None, rtol=None, atol=None):
    """Runs fn on CPU and tpu from the same inputs; compares outputs and input grads.

    The first output is differentiated with the same random grad_output on both devices.
    """
    requires_grad = requires_grad or [True] * len(inputs)
    cpu_in = [t.clone().requires_grad_(rg) for t, rg in zip(inputs, requires_grad)]
    tpu_in = [tpu(t).requires_grad_(rg) for t, rg in zip(inputs, requires_grad)]
    expected, actual = as_tuple(fn(*cpu_in)), as_tuple(fn(*tpu_in))
    assert_same(actual, expected, rtol=rtol, atol=atol)
    grad = make(expected[0].shape, expected[0].dtype, seed=7)
    expected[0].backward(grad)
    actual[0].backward(tpu(grad))
    for a, e, rg in zip(tpu_in, cpu_in, requires_grad):
        if rg:
            assert_same(a.grad, e.grad, rtol=rtol, atol=atol)


def check_module(ctor, shape, dtype=torch.float32, rtol=None, atol=None):
    torch.manual_seed(0)
    m = ctor().to(dtype)
    mt = copy.deepcopy(m).to("tpu")
    x = make(shape, dtype, low=-1, high=1)
    xc, xt = x.clone().requires_grad_(), tpu(x).requires_grad_()
    y, yt = m(xc), mt(xt)
    assert_same(yt, y, rtol=rtol, atol=atol)
    grad = make(y.shape, dtype, low=-1, high=1, seed=7)
    y.backward(grad)
    yt.backward(tpu(grad))
    assert_same(xt.grad, xc.grad, rtol=rtol, atol=atol)
    for (name, p), pt in zip(m.named_parameters(), mt.parameters()):
        assert_same(pt.grad, p.grad, rtol=rtol, atol=atol)


# ---- convolution ------------------------------------------------------------------------------

CONV_CASES = {
    "conv1d": (lambda: nn.Conv1d(4, 6, 3), (2, 4, 9)),
    "conv1d_s2_p2_d2_g2": (lambda: nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2), (2, 4, 11)),
    "conv1d_same_even_k": (lambda: nn.Conv1d(3, 6, 4, padding="same", groups=3, bias=False), (2, 3, 10)),
    "conv2d": (lambda: nn.Conv2d(3, 5, 3, padding=1), (2, 3, 7, 6)),
    "conv2d_mixed": (lambda: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2,
                                       bias=False), (2, 4, 9, 8)),
    "conv2d_depthwise": (lambda: nn.Conv2d(4, 8, 3, stride=2, groups=4), (1, 4, 8, 9)),
    "conv2d_same_dilated": (lambda: nn.Conv2d(2, 3, 3, padding="same", dilation=2), (2, 2, 7, 7)),
    "conv2d_1x1": (lambda: nn.Conv2d(6, 4, 1), (3, 6, 4, 4)),
    "conv3d": (lambda: nn.Conv3d(2, 4, (2, 3, 2), stride=(1, 2, 1), padding=(1, 0, 1)), (2, 2, 5, 6, 5)),
    "conv3d_groups": (lambda: nn.Conv3d(4, 4, 3, padding=1, groups=2, dilation=(1, 2, 1)), (1, 4, 4, 6, 4)),
    # padding > dilation*(kernel-1): the transposed conv crops
    "convT1d_crop": (lambda: nn.ConvTranspose1d(4, 2, 5, stride=3, padding=4), (2, 4, 7)),
    "convT1d_groups": (lambda: nn.ConvTranspose1d(2, 4, 3, stride=2, padding=1, output_padding=1, groups=2),
                       (2, 2, 6)),
    "convT2d": (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=2),
                (2, 4, 5, 6)),
    "convT2d_plain": (lambda: nn.ConvTranspose2d(3, 2, (2, 3)), (2, 3, 4, 5)),
    # output_padding >= stride (allowed since < dilation)
    "convT2d_outpad_dilation": (lambda: nn.ConvTranspose2d(2, 3, 3, stride=(2, 1), padding=(0, 1),
                                                           output_padding=(1, 2), dilation=(1, 3)), (1, 2, 4, 5)),
    "convT3d": (lambda: nn.ConvTranspose3d(2, 4, 3, stride=2, padding=1, output_padding=(1, 0, 1), bias=False),
                (1, 2, 3, 4, 3)),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_module_float32(case):
    ctor, shape = CONV_CASES[case]
    check_module(ctor, shape)


@pytest.mark.parametrize("case", ["conv2d_mixed", "conv1d_same_even_k", "convT2d", "conv3d"])
def test_conv_module_bfloat16(case):
    ctor, shape = CONV_CASES[case]
    # Sums of many products: one bfloat16 ulp of a result near 4 is 0.03.
    check_module(ctor, shape, torch.bfloat16, rtol=2e-2, atol=5e-2)


def test_conv_float64():
    check_module(CONV_CASES["conv2d_mixed"][0], CONV_CASES["conv2d_mixed"][1], torch.float64)


@pytest.mark.parametrize("requires_grad", [[True, False, False], [False, True, True], [False, True, False],
                                           [True, False, True]])
@pytest.mark.parametrize("transposed", [False, True])
def test_conv_partial_grads(requires_grad, transposed):
    # convolution_backward gets an output_mask with only the grads autograd needs.
    x = make((2, 4, 6, 5), low=-1, high=1)
    if transposed:
        w, fn = make((4, 3, 3, 2), seed=1), lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, groups=2)
    else:
        w, fn = make((6, 2, 3, 2), seed=1), lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2)
    check_autograd(fn, [x, w, make((6,), seed=2)], requires_grad)


def test_conv_unbatched_noncontiguous_channels_last():
    w = make((5, 3, 3, 3), seed=1, noncontiguous=True)
    check_autograd(lambda x, w: F.conv2d(x, w, stride=2), [make((3, 8, 7), noncontiguous=True), w])
    check_autograd(lambda x, w: F.conv1d(x, w, padding=1), [make((3, 8)), make((2, 3, 3), seed=1)])
    x = make((2, 3, 6, 6)).to(memory_format=torch.channels_last)
    check_autograd(lambda x, w: F.conv2d(x, w, padding=1), [x, make((4, 3, 3, 3), seed=1)])


def test_conv_bad_input_raises_like_cpu():
    def check_raises(fn, *inputs):
        with pytest.raises(Exception) as cpu_err:
            fn(*inputs)
        with pytest.raises(cpu_err.type):
            fn(*tpu(inputs))

    x = make((2, 4, 6, 6))
    check_raises(lambda x, w: F.conv2d(x, w), x, make((3, 3, 3, 3)))  # wrong input channels
    check_raises(lambda x, w: F.conv2d(x, w, groups=3), x, make((3, 1, 3, 3)))  # groups do not divide
    check_raises(lambda x, w: F.conv2d(x, w), x, make((3, 4, 7, 7)))  # kernel larger than input
    # checks of _convolution that convolution's Meta kernel lacks
    check_raises(lambda x, w: F.conv_transpose2d(x, w, stride=2, output_padding=2), x, make((4, 2, 3, 3)))
    check_raises(lambda x, w: F.conv2d(x, w, padding=-1), x, make((3, 4, 3, 3)))
    check_raises(lambda x, w, b: F.conv2d(x, w, b), x, make((3, 4, 3, 3)), make((4,)))
    check_raises(lambda x, w: F.conv2d(x, w), x, make((3, 4, 3, 3), torch.float64))


# ---- max pooling ------------------------------------------------------------------------------

MAX_POOL_CASES = {
    "2d": (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), (2, 3, 8, 9)),
    "2d_ceil_dilation": (lambda x: F.max_pool2d(x, (3, 2), (2, 3), 1, dilation=(2, 1), ceil_mode=True,
                                                return_indices=True), (2, 3, 10, 9)),
    "2d_unbatched_overlap": (lambda x: F.max_pool2d(x, 3, 1, return_indices=True), (3, 6, 5)),
    "1d": (lambda x: F.max_pool1d(x, 3, 2, 1, ceil_mode=True, return_indices=True), (2, 3, 10)),
    "3d": (lambda x: F.max_pool3d(x, 2, 2, 1, ceil_mode=True, return_indices=True), (1, 2, 5, 6, 5)),
    "3d_dilation": (lambda x: F.max_pool3d(x, (2, 3, 2), (1, 2, 2), (1, 1, 0), dilation=(2, 1, 2),
                                           return_indices=True), (2, 1, 6, 7, 6)),
    "module": (nn.MaxPool2d(2), (2, 3, 6, 6)),
}


def ties(shape, dtype=torch.float32, seed=0):
    # Few distinct values: many ties, so the index rule (first maximum) matters.
    return make(shape, torch.float32, low=-2, high=2, seed=seed).round().to(dtype)


@pytest.mark.parametrize("case", list(MAX_POOL_CASES))
def test_max_pool(case):
    fn, shape = MAX_POOL_CASES[case]
    check_autograd(fn, [make(shape)])
    check_autograd(fn, [ties(shape)])


@pytest.mark.parametrize("case", ["2d_ceil_dilation", "3d"])
def test_max_pool_bfloat16(case):
    fn, shape = MAX_POOL_CASES[case]
    check_autograd(fn, [ties(shape, torch.bfloat16)])


def test_max_pool_nan_and_inf_like_cpu():
    x = make((1, 2, 6, 6))
    x[0, 0, 1, 1] = float("nan")
    x[0, 0, 1, 2] = float("nan")  # the last NaN of a window wins on CPU
    x[0, 1, :3, :3] = float("-inf")  # windows of -inf: index of the first valid element
    fn = MAX_POOL_CASES["2d"][0]
    assert_same(fn(tpu(x)), fn(x))
    fn = lambda t: F.adaptive_max_pool2d(t, (4, 3), return_indices=True)  # noqa: E731
    assert_same(fn(tpu(x)), fn(x))


def test_max_pool_int():
    x = make((2, 2, 7, 6), torch.int64)
    fn = MAX_POOL_CASES["2d_ceil_dilation"][0]
    assert_same(fn(tpu(x)), fn(x))


# ---- average pooling --------------------------------------------------------------------------

AVG_POOL_CASES = {
    "2d": (lambda x: F.avg_pool2d(x, 3, 2, 1), (2, 3, 8, 9)),
    "2d_ceil_exclude_pad": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                            (2, 3, 8, 9)),
    "2d_ceil_include_pad": (lambda x: F.avg_pool2d(x, (3, 2), (2, 1), (1, 1), ceil_mode=True), (2, 3, 8, 9)),
    "2d_divisor_unbatched": (lambda x: F.avg_pool2d(x, (2, 3), (1, 2), (1, 0), divisor_override=5), (3, 8, 9)),
    "1d": (lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True), (2, 3, 10)),
    "3d": (lambda x: F.avg_pool3d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), (1, 2, 6, 7, 5)),
    "3d_divisor": (lambda x: F.avg_pool3d(x, (2, 2, 3), (2, 1, 2), divisor_override=3), (2, 1, 4, 5, 7)),
    "module": (nn.AvgPool2d(2), (2, 3, 6, 6)),
}


@pytest.mark.parametrize("case", list(AVG_POOL_CASES))
def test_avg_pool(case):
    fn, shape = AVG_POOL_CASES[case]
    check_autograd(fn, [make(shape)])


@pytest.mark.parametrize("case", ["2d_ceil_exclude_pad", "2d_divisor_unbatched"])
def test_avg_pool_bfloat16(case):
    fn, shape = AVG_POOL_CASES[case]
    check_autograd(fn, [make(shape, torch.bfloat16)])


def test_avg_pool_int():
    x = make((2, 2, 7, 6), torch.int64, low=-20, high=20)
    fn = AVG_POOL_CASES["2d_ceil_include_pad"][0]
    assert_same(fn(tpu(x)), fn(x))


# ---- adaptive pooling -------------------------------------------------------------------------

ADAPTIVE_CASES = {
    "2d": ((3, 4), (2, 3, 8, 9)),
    "2d_upsample": ((5, 7), (1, 2, 3, 4)),  # more outputs than inputs: windows repeat
    "2d_unbatched": ((2, 2), (3, 7, 5)),
    "1d": ((4,), (2, 3, 10)),
    "3d": ((2, 3, 4), (1, 2, 5, 7, 9)),
}
ADAPTIVE_AVG = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}
ADAPTIVE_MAX = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}


@pytest.mark.parametrize("case", list(ADAPTIVE_CASES))
def test_adaptive_avg_pool(case):
    out, shape = ADAPTIVE_CASES[case]
    check_autograd(lambda x: ADAPTIVE_AVG[len(out)](x, out), [make(shape)])


@pytest.mark.parametrize("case", list(ADAPTIVE_CASES))
def test_adaptive_max_pool(case):
    out, shape = ADAPTIVE_CASES[case]
    fn = lambda x: ADAPTIVE_MAX[len(out)](x, out, return_indices=True)  # noqa: E731
    check_autograd(fn, [make(shape)])
    check_autograd(fn, [ties(shape)])


def test_adaptive_pool_bfloat16():
    out, shape = ADAPTIVE_CASES["2d"]
    check_autograd(lambda x: F.adaptive_avg_pool2d(x, out), [make(shape, torch.bfloat16)])
    check_autograd(lambda x: F.adaptive_max_pool2d(x, out, return_indices=True), [ties(shape, torch.bfloat16)])


def test_pool_bad_input_raises_like_cpu():
    def check_raises(fn, x):
        with pytest.raises(Exception) as cpu_err:
            fn(x)
        with pytest.raises(cpu_err.type):
            fn(tpu(x))

    x = make((1, 2, 5, 5))
    check_raises(lambda t: F.max_pool2d(t, 2, padding=2), x)  # padding above half the kernel
    check_raises(lambda t: F.max_pool2d(t, 7), x)  # output would be empty
    check_raises(lambda t: F.avg_pool2d(t, 3, divisor_override=0), x)
    check_raises(lambda t: F.avg_pool3d(t, 2), x[0])  # 3-d input to a 3-d pool
    check_raises(lambda t: F.adaptive_max_pool2d(t, (2, 2, 2)), x)


@pytest.mark.parametrize("conv,shape", [(torch.nn.Conv1d, (2, 0, 15)), (torch.nn.Conv2d, (2, 0, 6, 5))])
def test_conv_with_no_input_channels_is_empty_like_cpu(conv, shape):
    torch.manual_seed(0)
    m = conv(0, 8, 2, stride=2)
    x = torch.randn(shape)
    expected = m(x)
    mt, xt = m.to("tpu"), tpu(x).requires_grad_()
    out = mt(xt)
    assert out.shape == expected.shape
    out.sum().backward()
    assert xt.grad.shape == x.shape and mt.weight.grad.abs().sum().item() == 0


@pytest.mark.parametrize("nd,out,size", [(1, [3], [12]), (2, [2, 3], [4, 9]), (3, [1, 2, 2], [3, 4, 2]), (2, [1, 1], [7, 5])])
def test_adaptive_max_pool_even_windows_pick_as_cpu(nd, out, size):
    # Output sizes that divide the input: a strided max pool (one
    # reduce_window); ties pick the first, NaN the last NaN, as CPU.
    g = torch.Generator().manual_seed(nd)
    x = torch.randint(-2, 2, (2, 3, *size), generator=g).float()
    x[torch.rand(x.shape, generator=g) < 0.1] = float("nan")
    fn = [None, F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d][nd]
    c, t = fn(x, out, return_indices=True), fn(tpu(x), out, return_indices=True)
    assert_same(t[1], c[1])
    assert_same(t[0], c[0])


@pytest.mark.parametrize("shape,k,s", [((2, 3, 8, 8), 2, 2), ((3, 7, 9), 3, 2), ((1, 2, 5, 6), 2, 1)])
def test_max_unpool2d_round_trip_and_gradient(shape, k, s, no_cpu_fallback):
    x = make(shape, torch.float32)
    res = []
    for dev in ("cpu", "tpu"):
        xd = x.to(dev).detach().clone().requires_grad_(True)
        o, i = F.max_pool2d(xd, k, s, return_indices=True)
        u = F.max_unpool2d(o, i, k, s, output_size=shape[-2:])
        u.backward(make(u.shape, torch.float32, seed=5).to(dev))
        res.append((u, xd.grad))
    assert_same(res[1][0], res[0][0])
    assert_same(res[1][1], res[0][1])


def test_max_unpool3d_and_a_bad_index(no_cpu_fallback):
    x = make((2, 2, 4, 6, 6), torch.float32)
    o, i = F.max_pool3d(x, 2, 2, return_indices=True)
    assert_same(F.max_unpool3d(tpu(o), tpu(i), 2, 2), F.max_unpool3d(o, i, 2, 2))
    with pytest.raises(RuntimeError, match="invalid max index"):
        F.max_unpool2d(tpu(torch.ones(1, 1, 2, 2)), tpu(torch.tensor([[[[0, 1], [2, 99]]]])), 2).cpu()


CL = torch.channels_last


@pytest.mark.parametrize("name,fn", [
    ("conv2d", lambda x, w: F.conv2d(x, w, padding=1)),
    ("conv_transpose2d", lambda x, w: F.conv_transpose2d(x, w.transpose(0, 1).contiguous())),
    ("reflection_pad2d", lambda x, w: F.pad(x, (1, 2, 1, 2), mode="reflect")),
    ("replication_pad2d", lambda x, w: F.pad(x, (1, 2, 1, 2), mode="replicate")),
])
@pytest.mark.parametrize("layout", ["input", "weight", "neither"])
def test_channels_last_kept_as_cpu_keeps_it(name, fn, layout):
    # CPU's kernels give channels_last results for a channels_last input (and,
    # for convolution, a channels_last weight); the Meta path was contiguous.
    x = torch.randn(2, 3, 6, 6)
    w = torch.randn(4, 3, 3, 3)
    if layout == "input":
        x = x.contiguous(memory_format=CL)
    if layout == "weight":
        w = w.contiguous(memory_format=CL)
    xc, xt = x.clone().requires_grad_(), tpu(x).requires_grad_()
    expected, actual = fn(xc, w), fn(xt, tpu(w))
    assert actual.stride() == expected.stride()
    assert_same(actual, expected)
    g = torch.randn_like(expected)
    expected.backward(g)
    actual.backward(tpu(g))
    assert_same(xt.grad, xc.grad)


def test_channels_last_backward_ops_follow_cpu():
    x = torch.randn(2, 3, 6, 6).contiguous(memory_format=CL)
    w = torch.randn(4, 3, 3, 3)
    go = torch.randn(2, 4, 4, 4)
    args = ([4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, True])
    want = torch.ops.aten.convolution_backward(go, x, w, *args)
    got = torch.ops.aten.convolution_backward(tpu(go), tpu(x), tpu(w), *args)
    assert [t.stride() for t in got] == [t.stride() for t in want]
    assert_same(got, want)
    g = torch.randn(2, 3, 8, 8)
    for op in (torch.ops.aten.reflection_pad2d_backward, torch.ops.aten.replication_pad2d_backward):
        want, got = op(g, x, [1, 1, 1, 1]), op(tpu(g), tpu(x), [1, 1, 1, 1])
        assert got.stride() == want.stride()
        assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("x_shape,w_shape,groups", [
    ((1, 2, 3, 4, 4), (3, 2, 2, 2, 2), 1),   # float32: CPU's slow_conv3d, contiguous
    ((2, 2, 3, 4, 4), (3, 2, 2, 2, 2), 1),   # float32: mkldnn, channels_last_3d
    ((1, 2, 3, 8, 8), (4, 2, 3, 4, 4), 1),   # large kernel: mkldnn
    ((1, 2, 3, 4, 4), (4, 1, 2, 2, 2), 2),   # groups: mkldnn
])
def test_channels_last_3d_follows_cpus_backend_choice(dtype, x_shape, w_shape, groups):
    # CPU keeps channels_last_3d only where it picks mkldnn (never in float64).
    x = torch.randn(x_shape, dtype=dtype).contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(w_shape, dtype=dtype)
    want = F.conv3d(x, w, groups=groups)
    got = F.conv3d(tpu(x), tpu(w), groups=groups)
    assert got.stride() == want.stride()
    assert_same(got, want)


@pytest.mark.parametrize("shape,k", [((6, 5, 6, 7), 2), ((6, 14, 12, 13), (5, 6, 7))])
def test_unbatched_channels_last_3d_max_pool3d_as_cpu(shape, k):
    # CPU's kernel treats an unbatched (C, D, H, W) input as a batch of one:
    # its results (and the gradient) are channels_last_3d when that batch is.
    x = torch.randn((1, *shape)).contiguous(memory_format=torch.channels_last_3d)[0]
    xc, xt = x.clone().requires_grad_(), tpu(x).requires_grad_()
    (out_c, ind_c), (out_t, ind_t) = F.max_pool3d(xc, k, return_indices=True), F.max_pool3d(xt, k, return_indices=True)
    assert (out_t.stride(), ind_t.stride()) == (out_c.stride(), ind_c.stride())
    assert_same(out_t, out_c)
    assert torch.equal(ind_t.cpu(), ind_c)
    g = torch.randn_like(out_c)
    want = torch.ops.aten.max_pool3d_with_indices_backward(g, x, [*(k if isinstance(k, tuple) else (k,) * 3)],
                                                           [], [0] * 3, [1] * 3, False, ind_c)
    got = torch.ops.aten.max_pool3d_with_indices_backward(tpu(g), tpu(x), [*(k if isinstance(k, tuple) else (k,) * 3)],
                                                          [], [0] * 3, [1] * 3, False, ind_t)
    assert got.stride() == want.stride()
    assert_same(got, want)
