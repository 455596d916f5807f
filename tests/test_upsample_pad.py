"""F.pad and F.interpolate on tpu vs PyTorch on CPU: outputs and gradients."""
import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same, make, tpu, check_raises

GRAD_DTYPES = [torch.float32, torch.bfloat16]


def check_grad(fn, x, dtype, seed=1):
    """fn(x) and d(sum(fn(x) * w))/dx on both devices from the same inputs."""
    xc = x.clone().requires_grad_()
    xt = tpu(x).requires_grad_()
    yc, yt = fn(xc), fn(xt)
    assert_same(yt, yc)
    w = make(yc.shape, dtype, seed=seed)
    (yc * w).sum().backward()
    (yt * tpu(w)).sum().backward()
    # bfloat16 gradients sum several rounded products: a little more room.
    tol = {} if dtype != torch.bfloat16 else dict(rtol=3e-2, atol=3e-2)
    assert_same(xt.grad, xc.grad, **tol)


# ---- F.pad -------------------------------------------------------------------------------

PAD_CASES = [
    # (input shape, pad)
    ((2, 3, 7), (2, 3)),
    ((3, 7), (1, 0)),                       # unbatched
    ((2, 3, 7), (-1, 2)),                   # negative: crop
    ((2, 2, 5, 6), (1, 2, 3, 1)),
    ((2, 5, 6), (2, 0, -1, 4)),
    ((1, 2, 4, 5, 6), (1, 2, 0, 3, 2, 1)),
    ((2, 4, 5, 3), (1, -1, 2, 1, 1, 0)),    # unbatched 3d
]


def with_bf16(cases, bf16_picks):
    """float32 for every case, bfloat16 for a few (keeps the file fast)."""
    return ([c + (torch.float32,) for c in cases] +
            [cases[i] + (torch.bfloat16,) for i in bf16_picks])


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape,pad,dtype", with_bf16(PAD_CASES, [0, 3, 5]))
def test_reflect_replicate_pad(shape, pad, mode, dtype):
    check_grad(lambda t: F.pad(t, pad, mode=mode), make(shape, dtype), dtype)


@pytest.mark.parametrize("shape,pad,dtype", with_bf16([((2, 3, 7), (2, 3)), ((2, 2, 5, 6), (1, -2, 3, 0))], [1]))
def test_circular_pad(shape, pad, dtype):
    check_grad(lambda t: F.pad(t, pad, mode="circular"), make(shape, dtype), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
@pytest.mark.parametrize("pad,value", [((1, 2), 0.0), ((1, 2, -1, 3), 2.5), ((0, 0, 0, 0, 2, 1), -1.0),
                                       ((2, -3), 1.0)])
def test_constant_pad(pad, value, dtype):
    x = make((2, 3, 5), dtype)
    if dtype.is_floating_point:
        check_grad(lambda t: F.pad(t, pad, value=value), x, dtype)
    else:
        v = int(value) if dtype != torch.bool else bool(value)
        assert_same(F.pad(tpu(x), pad, value=v), F.pad(x, pad, value=v))


def test_constant_pad_bfloat16():
    check_grad(lambda t: F.pad(t, (1, 2, -1, 3), value=2.5), make((2, 3, 5), torch.bfloat16), torch.bfloat16)


def test_pad_int_and_noncontiguous():
    x = make((2, 3, 6), torch.int64)
    assert_same(F.pad(tpu(x), (2, 3), mode="reflect"), F.pad(x, (2, 3), mode="reflect"))
    assert_same(F.pad(tpu(x), (2, 3, 1, 0), mode="replicate"), F.pad(x, (2, 3, 1, 0), mode="replicate"))
    y = make((2, 4, 5), noncontiguous=True).transpose(1, 2)
    check_grad(lambda t: F.pad(t, (1, 2), mode="reflect"), y, torch.float32)
    check_grad(lambda t: F.pad(t, (1, 2, 2, 0), mode="replicate"), y, torch.float32)


def test_pad_bad_input():
    x = make((2, 3, 4))
    # Reflection needs the pad to be smaller than the dim.
    check_raises(lambda t: F.pad(t, (4, 0), mode="reflect"), x)
    check_raises(lambda t: F.pad(t, (1, 1, 3, 0), mode="reflect"), x)
    # Wrong rank for the padding size (PyTorch's Meta kernel lets this one through).
    check_raises(lambda t: torch.ops.aten.reflection_pad2d(t, [1, 1, 1, 1]), make((2, 1, 3, 4, 5)))
    check_raises(lambda t: torch.ops.aten.replication_pad1d(t, [1, 1]), make((2, 1, 3, 4)))
    check_raises(lambda t: torch.ops.aten.replication_pad1d(t, [-3, -2]), x)


# ---- F.interpolate -----------------------------------------------------------------------

# (input shape, size or None, scale_factor or None)
NEAREST_CASES = [
    ((2, 3, 5), 10, None),
    ((2, 3, 7), 4, None),                   # downsampling
    ((2, 3, 5), None, 2.1),                 # out == 2 * in with a scale: CPU's backward shortcut
    ((2, 3, 4, 5), (7, 3), None),
    ((1, 2, 4, 5), None, (1.5, 2.0)),
    ((1, 2, 3, 4, 5), (5, 4, 8), None),
    ((1, 2, 3, 2, 4), None, 1.7),
]


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("shape,size,scale,dtype", with_bf16(NEAREST_CASES, [2, 4]))
def test_interpolate_nearest(shape, size, scale, mode, dtype):
    check_grad(lambda t: F.interpolate(t, size=size, scale_factor=scale, mode=mode), make(shape, dtype), dtype)


def test_interpolate_nearest_uint8():
    x = make((2, 3, 4, 5), torch.uint8, high=200)
    for mode in ["nearest", "nearest-exact"]:
        assert_same(F.interpolate(tpu(x), size=(7, 9), mode=mode), F.interpolate(x, size=(7, 9), mode=mode))


LINEAR_CASES = [
    ("linear", (2, 3, 5), 11, None),
    ("linear", (2, 3, 9), 4, None),
    ("linear", (2, 3, 5), None, 2.5),
    ("linear", (2, 3, 5), 5, None),          # same size: copy
    ("bilinear", (2, 3, 4, 5), (7, 3), None),
    ("bilinear", (1, 2, 4, 5), None, (1.5, 2.0)),
    ("bilinear", (2, 2, 6, 6), (1, 6), None),
    ("trilinear", (1, 2, 3, 4, 5), (5, 4, 8), None),
    ("bicubic", (2, 3, 4, 5), (7, 3), None),
    ("bicubic", (1, 2, 5, 4), None, (2.0, 1.3)),
    ("bicubic", (1, 2, 4, 5), (4, 5), None),
]


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("mode,shape,size,scale,dtype", with_bf16(LINEAR_CASES, [0, 4, 7, 9]))
def test_interpolate_linear_cubic(mode, shape, size, scale, align_corners, dtype):
    check_grad(lambda t: F.interpolate(t, size=size, scale_factor=scale, mode=mode,
                                       align_corners=align_corners), make(shape, dtype), dtype)


def test_interpolate_float64_and_noncontiguous():
    x = make((2, 3, 4, 5), torch.float64)
    check_grad(lambda t: F.interpolate(t, scale_factor=1.7, mode="bilinear"), x, torch.float64)
    check_grad(lambda t: F.interpolate(t, scale_factor=2.3, mode="nearest"), x, torch.float64)
    y = make((2, 5, 4, 3), noncontiguous=True).permute(0, 3, 1, 2)
    check_grad(lambda t: F.interpolate(t, size=(6, 7), mode="bilinear"), y, torch.float32)
    check_grad(lambda t: F.interpolate(t, size=(6, 7), mode="bicubic", align_corners=True), y, torch.float32)


def test_interpolate_bad_input():
    check_raises(lambda t: F.interpolate(t, size=(0, 3), mode="nearest"), make((1, 2, 3, 4)))
    check_raises(lambda t: torch.ops.aten.upsample_bilinear2d(t, [4, 4], False), make((2, 3, 4)))


@pytest.mark.parametrize("mode,align,scale", [("bilinear", False, 2), ("bilinear", True, 2),
                                              ("bilinear", False, 0.5), ("bicubic", False, 2)])
def test_interpolate_uint8_images_match_cpu_exactly(mode, align, scale):
    x = torch.randint(0, 256, (2, 3, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    f = lambda t: torch.nn.functional.interpolate(t, scale_factor=scale, mode=mode, align_corners=align)  # noqa: E731
    assert torch.equal(f(tpu(x)).cpu(), f(x))


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_half_bilinear_keeps_float32_weights_as_cpu(dt):
    # CPU's 2-d bilinear kernel keeps its weights in float32 (the other
    # interpolations round them to the input dtype): rounded ones were up to
    # 22% off the float64 value where CPU is 0.35% off.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 7, generator=g).to(dt)
    for mf in [torch.contiguous_format, torch.channels_last]:
        for align in [False, True]:
            xi = x.contiguous(memory_format=mf)
            want = F.interpolate(xi, size=(9, 4), mode="bilinear", align_corners=align).float()
            got = F.interpolate(xi.to("tpu"), size=(9, 4), mode="bilinear", align_corners=align).cpu().float()
            # (within one ulp of the result: CPU's own sum order differs)
            torch.testing.assert_close(got, want, rtol=torch.finfo(dt).eps, atol=torch.finfo(dt).eps / 4)


# Antialiased resize (torchvision's Resize on tensors, timm's position-embedding
# resampling): a window as wide as the downscale, PIL's filters.
AA_CASES = [((2, 3, 17, 23), (3, 5)), ((1, 2, 8, 8), (16, 7)), ((2, 1, 5, 40), (34, 4)), ((1, 2, 9, 9), (1, 1)),
            ((1, 1, 12, 10), (12, 3))]


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("shape,size", AA_CASES)
def test_interpolate_antialiased(shape, size, mode, align_corners):
    for dtype in [torch.float32, torch.float64]:
        check_grad(lambda t: F.interpolate(t, size=size, mode=mode, align_corners=align_corners, antialias=True),
                   make(shape, dtype), dtype)


def test_interpolate_antialiased_scale_factors_nonfinite_and_dtypes():
    x = make((1, 2, 30, 20))
    for sf in [0.3, 0.77, 1.6]:
        for mode in ["bilinear", "bicubic"]:
            f = lambda t: F.interpolate(t, scale_factor=sf, mode=mode, antialias=True)  # noqa: E731
            assert_same(f(tpu(x)), f(x))
    # An inf or NaN reaches the outputs whose windows hold it, as on CPU.
    y = make((1, 1, 9, 9))
    y[0, 0, 4, 4], y[0, 0, 1, 7] = float("inf"), float("nan")
    for mode in ["bilinear", "bicubic"]:
        assert_same(F.interpolate(tpu(y), size=(4, 3), mode=mode, antialias=True),
                    F.interpolate(y, size=(4, 3), mode=mode, antialias=True))
    # uint8 images: CPU's fixed-point kernel, exactly; half types: CPU's error.
    u = torch.randint(0, 256, (1, 3, 20, 20), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(F.interpolate(tpu(u), size=(7, 9), mode="bicubic", antialias=True).cpu(),
                       F.interpolate(u, size=(7, 9), mode="bicubic", antialias=True))
    check_raises(lambda t: F.interpolate(t, size=(3, 3), mode="bilinear", antialias=True),
                 make((1, 1, 8, 8), torch.bfloat16))


def test_interpolate_antialiased_extreme_downscale():
    # Windows of 4,001 taps (bilinear) and 8,001 (bicubic): one gather and a
    # sum over a taps dim (the unrolled form, an op per tap, took minutes to
    # compile at this width).
    x = make((1, 2, 4000, 3), torch.float64)
    for mode in ["bilinear", "bicubic"]:
        check_grad(lambda t: F.interpolate(t, size=(2, 2), mode=mode, antialias=True), x, torch.float64)


def test_interpolate_antialiased_in_compiled_graphs():
    # Lowered into the graph for float inputs; a uint8 image (CPU's fixed-point
    # kernel) makes the lowering decline: the graph is compiled around the op.
    f = torch.compile(lambda t: F.interpolate(t, size=(7, 9), mode="bicubic", antialias=True) * 2, backend="tpu")
    x = make((1, 3, 20, 20))
    assert_same(f(tpu(x)), F.interpolate(x, size=(7, 9), mode="bicubic", antialias=True) * 2)
    g = torch.compile(lambda t: F.interpolate(t, size=(7, 9), mode="bilinear", antialias=True) + 1, backend="tpu")
    u = torch.randint(0, 250, (1, 3, 20, 20), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="cannot lower aten::_upsample_bilinear2d_aa"):
        got = g(tpu(u))
    assert torch.equal(got.cpu(), F.interpolate(u, size=(7, 9), mode="bilinear", antialias=True) + 1)


@pytest.mark.parametrize("mode,shape", [("nearest", (1, 5, 32, 32)), ("bilinear", (1, 5, 32, 32)),
                                        ("bicubic", (1, 5, 32, 32)), ("linear", (2, 5, 600)),
                                        ("trilinear", (1, 5, 8, 16, 16))])
@pytest.mark.parametrize("dtype", [torch.int16, torch.int64, torch.bool, torch.uint8])
def test_interpolate_dtypes_cpu_lacks_raise_as_on_cpu(mode, shape, dtype):
    # Large enough (5,120 elements) that no CPU run is asked: the lowering
    # itself knows CPU's kernels (uint8 for nearest and 2-d bilinear/bicubic).
    x = torch.ones(shape, dtype=dtype)
    f = lambda t: F.interpolate(t, scale_factor=0.5, mode=mode)  # noqa: E731
    if dtype == torch.uint8 and mode in ("nearest", "bilinear", "bicubic"):
        assert torch.equal(f(tpu(x)).cpu(), f(x))
    else:
        check_raises(f, x)
