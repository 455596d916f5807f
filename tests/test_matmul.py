"""Matrix products (mm, bmm, mv, dot, addmm, baddbmm, ...) and the composites
that decompose into them (matmul, linear, einsum), on tpu vs CPU."""
import pytest
import torch

from conftest import FLOAT_DTYPES, assert_same, make, tpu, check_raises

# Sums of products: float32 results differ from CPU's blocked kernels by more
# than elementwise rounding, so float32 gets rtol 1e-5 / atol 1e-4.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-4)}


def check(fn, *inputs, dtype=torch.float32):
    assert_same(fn(*tpu(inputs)), fn(*inputs), **TOL.get(dtype, {}))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int64, torch.int32])
def test_mm_bmm_mv_dot(dtype):
    a, b = make((3, 7), dtype), make((7, 5), dtype, seed=1)
    check(torch.mm, a, b, dtype=dtype)
    check(torch.bmm, make((2, 3, 7), dtype), make((2, 7, 4), dtype, seed=1), dtype=dtype)
    check(torch.mv, a, make((7,), dtype, seed=2), dtype=dtype)
    check(torch.dot, make((7,), dtype), make((7,), dtype, seed=2), dtype=dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_half_products_accumulate_in_float32(dtype):
    # 512 products of 1 + 1: a float16/bfloat16 accumulator would lose the 1s.
    a = torch.ones(2, 1024, dtype=dtype)
    check(torch.mm, a, a.t(), dtype=dtype)
    a = make((4, 256), dtype)
    check(torch.mm, a, make((256, 3), dtype, seed=1), dtype=dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2), (0, 1.5)])
def test_addmm_baddbmm(dtype, beta, alpha):
    m1, m2 = make((3, 4), dtype), make((4, 5), dtype, seed=1)
    check(lambda s, x, y: torch.addmm(s, x, y, beta=beta, alpha=alpha), make((3, 5), dtype, seed=2), m1, m2,
          dtype=dtype)
    check(lambda s, x, y: torch.addmm(s, x, y, beta=beta, alpha=alpha), make((5,), dtype, seed=2), m1, m2,
          dtype=dtype)  # broadcast bias
    b1, b2 = make((2, 3, 4), dtype), make((2, 4, 5), dtype, seed=1)
    check(lambda s, x, y: torch.baddbmm(s, x, y, beta=beta, alpha=alpha), make((2, 3, 5), dtype, seed=2), b1, b2,
          dtype=dtype)


def test_beta_zero_ignores_nan_in_self():
    s = torch.full((3, 5), float("nan"))
    s[0, 0] = float("inf")
    m1, m2 = make((3, 4)), make((4, 5), seed=1)
    check(lambda s, x, y: torch.addmm(s, x, y, beta=0), s, m1, m2)
    check(lambda s, x, y: torch.baddbmm(s, x, y, beta=0, alpha=3),
          s.expand(2, 3, 5), make((2, 3, 4)), make((2, 4, 5), seed=1))


def test_addmv_addbmm():
    check(lambda s, m, v: torch.addmv(s, m, v, beta=0.5, alpha=2), make((3,)), make((3, 4)), make((4,), seed=1))
    check(lambda s, x, y: torch.addbmm(s, x, y, beta=2, alpha=0.5), make((3, 5)), make((2, 3, 4)),
          make((2, 4, 5), seed=1))


@pytest.mark.parametrize("shapes", [
    ((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((3, 4), (4, 5)), ((2, 3, 4), (4, 5)),
    ((4,), (2, 4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (3, 4, 5)),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul(shapes, dtype):
    check(torch.matmul, make(shapes[0], dtype), make(shapes[1], dtype, seed=1), dtype=dtype)


def test_noncontiguous_and_transposed():
    check(torch.mm, make((3, 4), noncontiguous=True), make((4, 5), seed=1))
    check(torch.mm, make((4, 3)).t(), make((5, 4), seed=1).t())
    check(torch.matmul, make((2, 3, 4), noncontiguous=True), make((2, 5, 4), seed=1).transpose(1, 2))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (4,)])
def test_linear(shape, bias):
    w, b = make((5, 4), seed=1), make((5,), seed=2)
    if bias:
        check(torch.nn.functional.linear, make(shape), w, b)
    else:
        check(torch.nn.functional.linear, make(shape), w)


@pytest.mark.parametrize("eq,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("i,i->", [(6,), (6,)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
])
def test_einsum(eq, shapes):
    check(lambda *t: torch.einsum(eq, *t), *[make(s, seed=i) for i, s in enumerate(shapes)])


def test_empty_and_degenerate():
    check(torch.mm, torch.empty(3, 0), torch.empty(0, 4))  # zeros
    check(torch.mm, torch.empty(0, 4), make((4, 5)))
    check(torch.bmm, torch.empty(0, 3, 4), torch.empty(0, 4, 5))
    check(torch.dot, torch.empty(0), torch.empty(0))


def test_shape_and_dtype_errors_like_cpu():
    check_raises(torch.mm, make((3, 4)), make((5, 6)))
    check_raises(torch.bmm, make((2, 3, 4)), make((3, 4, 5)))
    check_raises(torch.matmul, make((3, 4)), make((3, 4)))
    check_raises(torch.mm, make((3, 4)), make((4, 5), torch.float64))
    check_raises(torch.dot, make((3,)), make((4,)))
    check_raises(lambda s, x, y: torch.addmm(s, x, y), make((3, 5), torch.float64), make((3, 4)), make((4, 5)))


# ---- _grouped_mm (Mixture-of-Experts layers) ----------------------------------

OFFS = torch.tensor([2, 4, 4, 7], dtype=torch.int32)  # group ends (an empty group; row 7 in none)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_layouts_like_cpu(dtype, no_cpu_fallback):
    """The four layouts, compared where CPU's kernel writes (rows or columns
    past the last group end it leaves unwritten; the lowering gives 0)."""
    g = lambda *s, seed=0: make(s, dtype, seed=seed)  # noqa: E731
    grouped = torch._grouped_mm
    check(lambda a, b, o: grouped(a, b, offs=o)[:7], g(8, 16), g(4, 16, 8, seed=1), OFFS, dtype=dtype)  # 2D x 3D
    check(lambda a, b, o: grouped(a, b, offs=o)[:, :7], g(4, 4, 16), g(16, 8, seed=1), OFFS, dtype=dtype)  # 3D x 2D
    check(lambda a, b, o: grouped(a, b, offs=o), g(4, 8), g(8, 8, seed=1), OFFS, dtype=dtype)  # 2D x 2D over K
    check(lambda a, b: grouped(a, b), g(4, 4, 16), g(4, 16, 8, seed=1), dtype=dtype)  # 3D x 3D


def test_grouped_mm_grads_and_compiled_like_cpu(no_cpu_fallback):
    a, w = make((8, 16)), make((4, 16, 8), seed=1)
    offs = torch.tensor([2, 4, 4, 8], dtype=torch.int32)  # every row in a group

    def step(a, w, o):
        a, w = a.detach().requires_grad_(), w.detach().requires_grad_()
        out = torch._grouped_mm(a, w, offs=o)
        out.pow(2).sum().backward()
        return out, a.grad, w.grad

    for got, want in zip(step(*tpu((a, w, offs))), step(a, w, offs)):
        assert_same(got, want, **TOL[torch.float32])
    compiled = torch.compile(lambda a, w, o: torch._grouped_mm(a, w, offs=o).relu(), backend="tpu", fullgraph=True)
    assert_same(compiled(*tpu((a, w, offs))), torch._grouped_mm(a, w, offs=offs).relu(), **TOL[torch.float32])


# ---- int8 products of quantized inference ------------------------------------------------

def test_int_mm_exact_as_cpu(no_cpu_fallback):
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (32, 64), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (64, 24), dtype=torch.int8, generator=g)
    extreme = torch.full((4, 1024), -128, dtype=torch.int8)  # sums past int16, exact in int32
    u = torch.randint(0, 256, (32, 64), dtype=torch.uint8, generator=g)
    for x, y in [(a, b), (a[:, ::2], b[::2]), (extreme, extreme.t()), (a[:0], b), (u, b)]:
        want = torch._int_mm(x, y)
        got = torch._int_mm(tpu(x), tpu(y))
        assert got.device.type == "tpu" and got.dtype == torch.int32
        assert torch.equal(got.cpu(), want)


def test_int_mm_errors_as_cpu():
    a = torch.ones(4, 8, dtype=torch.int8)
    for x, y in [(a.int(), a.t()), (a, a), (a, a.t().to(torch.uint8))]:
        with pytest.raises(RuntimeError) as cpu_err:
            torch._int_mm(x, y)
        with pytest.raises(RuntimeError) as tpu_err:
            torch._int_mm(tpu(x), tpu(y))
        assert str(tpu_err.value).startswith(str(cpu_err.value))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_weight_int8pack_mm_as_cpu(dtype, no_cpu_fallback):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 64, generator=g).to(dtype)
    w = torch.randint(-128, 128, (24, 64), dtype=torch.int8, generator=g)
    s = (torch.rand(24, generator=g) / 50).to(dtype)
    want = torch.ops.aten._weight_int8pack_mm(x, w, s)
    assert_same(torch.ops.aten._weight_int8pack_mm(tpu(x), tpu(w), tpu(s)), want,
                rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5)


# ---- torch.get_float32_matmul_precision() -> XLA's operand precision ------------------------

def dot_programs(fn):
    from torch_pjrt import _state
    _state.C.record_programs(True)
    try:
        fn()
    finally:
        _state.C.record_programs(False)
    # (op programs only: fused eager also records the traces composed of them)
    return [text for name, text in _state.C.take_recorded_programs()
            if name.startswith("aten::") and ("stablehlo.dot_general" in text or "stablehlo.convolution" in text)]


@pytest.fixture
def matmul_precision():
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def test_float32_matmul_precision_reaches_eager_programs(matmul_precision):
    # XLA's DEFAULT is one bfloat16 pass on TPU (TF32 on GPU): float32 products
    # ask for HIGHEST as PyTorch's default "highest" means, HIGH for "high",
    # DEFAULT for "medium" (XLA:CPU computes float32 whatever is asked).
    a, b = make((11, 19), seed=3), make((19, 3), seed=4)  # shapes no other test uses
    want = a @ b
    seen = {}
    for setting in ("highest", "high", "medium"):
        matmul_precision(setting)
        x, y = tpu(a), tpu(b)
        texts = dot_programs(lambda: assert_same(x @ y, want, rtol=1e-5, atol=1e-5))
        assert len(texts) == 1, setting  # a new program per setting: plans are keyed by it
        seen[setting] = texts[0]
    assert "precision HIGHEST" in seen["highest"]
    assert "precision HIGH>" in seen["high"] and "HIGHEST" not in seen["high"]
    assert "precision_config" not in seen["medium"]
    matmul_precision("highest")
    assert dot_programs(lambda: (tpu(a) @ tpu(b)).cpu()) == []  # the first plan again


def test_widened_half_operands_take_only_the_passes_they_need(matmul_precision):
    # bfloat16 values are exact in one bfloat16 pass, float16 values in three:
    # a bfloat16 model's products stay single-pass on TPU whatever the setting.
    matmul_precision("highest")
    a, b = make((8, 16), seed=5), make((16, 4), seed=6)
    for dtype, attr in ((torch.bfloat16, None), (torch.float16, "precision HIGH>")):
        x, y = tpu(a.to(dtype)), tpu(b.to(dtype))
        texts = dot_programs(lambda: (x @ y).cpu())
        texts += dot_programs(lambda: torch.nn.functional.conv_transpose2d(x[None, None], y[None, None, :3, :3]).cpu())
        assert texts
        for t in texts:
            assert (attr in t) if attr else "precision_config" not in t
    x = tpu(a)[None, None]
    texts = dot_programs(lambda: torch.nn.functional.conv2d(x, x[:, :, :3, :3]).cpu())
    assert texts and all("precision HIGHEST" in t for t in texts)


def test_float32_matmul_precision_reaches_compiled_graphs():
    code = ("import torch, torch_pjrt\n"
            "f = torch.compile(lambda x, y: (x @ y).relu(), backend='tpu')\n"
            "a = torch.randn(8, 8, device='tpu')\n"
            "f(a, a).cpu()\n"
            "torch._dynamo.reset(); torch.set_float32_matmul_precision('medium')\n"
            "f(a, a).cpu()\n")
    from conftest import run_python
    r = run_python(code, TORCH_PJRT_DUMP="1")
    assert r.returncode == 0, r.stderr[-2000:]
    dots = [line for line in r.stderr.splitlines() if "stablehlo.dot_general" in line]
    assert len(dots) == 2
    assert "precision HIGHEST" in dots[0] and "precision_config" not in dots[1]


def test_weight_int8pack_mm_shapes_cpu_kernel_crashes_on():
    # CPU's bfloat16 kernel segfaults for K not a multiple of 8: the checks
    # made against CPU must not run it; compared with a float64 reference.
    g = torch.Generator().manual_seed(2)
    for m, k, n in ((3, 7, 48), (16, 8, 7), (3, 9, 16)):
        x = torch.randn(m, k, generator=g).bfloat16()
        w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
        s = torch.rand(n, generator=g).bfloat16()
        want = ((x.double() @ w.double().t()) * s.double()).bfloat16()
        assert_same(torch.ops.aten._weight_int8pack_mm(tpu(x), tpu(w), tpu(s)), want, rtol=1e-2, atol=1e-2)


def test_compiled_boolean_products_do_not_abort():
    # XLA's CPU dot emitter aborted the process on a boolean addmv (eager
    # mode raises CPU's NotImplementedError before any program; a compiled
    # graph asks CPU nothing): bool dots count in int32, true where any
    # product is.
    g = torch.Generator().manual_seed(0)
    a, m, v = (torch.rand(s, generator=g) > 0.7 for s in [(100,), (100, 100), (100,)])
    f = torch.compile(lambda a, m, v: torch.addmv(a, m, v), backend="tpu")
    got = f(a.to("tpu"), m.to("tpu"), v.to("tpu")).cpu()
    assert torch.equal(got, a | ((m.int() @ v.int()) > 0))
    h = torch.compile(lambda x, y: torch.mm(x, y), backend="tpu")
    assert torch.equal(h(m.to("tpu"), m.to("tpu")).cpu(), (m.int() @ m.int()) > 0)
