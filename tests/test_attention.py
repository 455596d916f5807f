"""F.scaled_dot_product_attention (and _safe_softmax) on tpu vs PyTorch on CPU.

On tpu SDPA takes PyTorch's math path; the CPU reference is pinned to the same
path so both run the same algorithm (CPU would otherwise pick its flash kernel).
"""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from conftest import assert_same, make, tpu


def sdpa(q, k, v, **kw):
    kw = {n: tpu(a) if isinstance(a, torch.Tensor) and q.device.type == "tpu" else a for n, a in kw.items()}
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def check_sdpa(shapes, dtype=torch.float32, grad_tol=None, **kw):
    """Output and q/k/v gradients on both devices from the same inputs."""
    qkv = [make(s, dtype, seed=i) for i, s in enumerate(shapes)]
    cpu_in = [t.clone().requires_grad_() for t in qkv]
    tpu_in = [tpu(t).requires_grad_() for t in qkv]
    out_c, out_t = sdpa(*cpu_in, **kw), sdpa(*tpu_in, **kw)
    assert_same(out_t, out_c)
    g = make(out_c.shape, dtype, seed=9)
    out_c.backward(g)
    out_t.backward(tpu(g))
    for a, e in zip(tpu_in, cpu_in):
        assert_same(a.grad, e.grad, **(grad_tol or {}))


B, H, L, S, E = 2, 3, 4, 6, 8
QKV = [(B, H, L, E), (B, H, S, E), (B, H, S, E)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"scale": 0.3}, {"scale": -0.5}],
                         ids=["plain", "causal", "scale", "negative_scale"])
def test_sdpa(kw, dtype):
    tol = dict(rtol=3e-2, atol=3e-2) if dtype == torch.bfloat16 else None
    check_sdpa(QKV, dtype, grad_tol=tol, **kw)


@pytest.mark.parametrize("mask_shape", [(L, S), (B, 1, L, S), (B, H, L, S)])
def test_sdpa_bool_mask(mask_shape):
    mask = make(mask_shape, torch.bool, seed=5)
    mask[..., 0] = True  # no fully masked rows here
    check_sdpa(QKV, attn_mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_float_mask(dtype):
    tol = dict(rtol=3e-2, atol=3e-2) if dtype == torch.bfloat16 else None
    check_sdpa(QKV, dtype, grad_tol=tol, attn_mask=make((B, 1, L, S), dtype, seed=6))


def test_sdpa_fully_masked_rows_give_zero():
    mask = make((L, S), torch.bool, seed=5)
    mask[1] = False  # query 1 sees nothing: _safe_softmax makes its row 0, not NaN
    mask[2] = True
    check_sdpa(QKV, attn_mask=mask)
    neg = torch.zeros(L, S)
    neg[3] = float("-inf")
    check_sdpa(QKV, attn_mask=neg)


def test_sdpa_shapes():
    check_sdpa([(H, L, E), (H, S, E), (H, S, 5)])                    # 3-D, value dim != qk dim
    check_sdpa([(2, B, H, L, E), (2, B, H, S, E), (2, B, H, S, E)], is_causal=True)  # 5-D
    check_sdpa([(B, H, S, E), (B, H, L, E), (B, H, L, E)], is_causal=True)          # L > S
    q, k, v = (make(s, noncontiguous=True) for s in QKV)
    assert_same(sdpa(tpu(q), tpu(k), tpu(v)), sdpa(q, k, v))


def test_sdpa_gqa():
    check_sdpa([(B, 4, L, E), (B, 2, S, E), (B, 2, S, E)], enable_gqa=True, is_causal=True)


def test_sdpa_dropout_zero_in_training_matches():
    check_sdpa(QKV, dropout_p=0.0)


def test_sdpa_dropout_statistics():
    # With v = I (S == value dim) the output is the dropped-out attention matrix
    # itself: every entry is 0 or attn / (1 - p), and about p of them are 0.
    p, n = 0.4, 64
    q, k = make((4, 8, n, 16), seed=1), make((4, 8, n, 16), seed=2)
    v = torch.eye(n).expand(4, 8, n, n).contiguous()
    attn = sdpa(q, k, v)
    torch.manual_seed(0)
    qt, kt, vt = tpu(q).requires_grad_(), tpu(k).requires_grad_(), tpu(v).requires_grad_()
    out = sdpa(qt, kt, vt, dropout_p=p)
    o = out.detach().cpu()
    kept = o != 0
    frac = 1 - kept.float().mean().item()
    assert abs(frac - p) < 0.02, frac
    torch.testing.assert_close(o[kept], (attn / (1 - p))[kept], rtol=1e-4, atol=1e-5)
    # The backward uses the same mask: d out / d v = dropped attn^T @ grad.
    g = make(o.shape, seed=3)
    out.backward(tpu(g))
    torch.testing.assert_close(vt.grad.cpu(), o.transpose(-2, -1) @ g, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(qt.grad.cpu()).all() and torch.isfinite(kt.grad.cpu()).all()
    # Seeded: the same mask again.
    torch.manual_seed(0)
    again = sdpa(tpu(q), tpu(k), tpu(v), dropout_p=p).cpu()
    assert torch.equal(again, o)


def test_sdpa_bad_input():
    q, k, v = (make(s) for s in QKV)
    mask = make((L, S), torch.bool)
    for fn, args in [
        (lambda q, k, v, m: sdpa(q, k, v, attn_mask=m, is_causal=True), (q, k, v, mask)),
        (lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), (q, k.double(), v, mask)),
        (lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), (q, k[..., :5], v, mask)),
    ]:
        with pytest.raises(Exception) as cpu_err:
            fn(*args)
        with pytest.raises(cpu_err.type):
            fn(*tpu(args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_safe_softmax(dtype):
    x = make((3, 4, 5), dtype)
    x[1, 2] = float("-inf")
    x[0, 1, :3] = float("-inf")
    xc, xt = x.clone().requires_grad_(), tpu(x).requires_grad_()
    yc, yt = torch.ops.aten._safe_softmax(xc, -1), torch.ops.aten._safe_softmax(xt, -1)
    assert_same(yt, yc)
    g = make(x.shape, dtype, seed=2)
    yc.backward(g)
    yt.backward(tpu(g))
    assert_same(xt.grad, xc.grad)
    assert_same(torch.ops.aten._safe_softmax(tpu(x), 1, torch.float64),
                torch.ops.aten._safe_softmax(x, 1, torch.float64))


# ---- the fused "overrideable" op (one program forward, one backward) -----------------------
# F.scaled_dot_product_attention reaches it once torch_pjrt registers a
# _fused_sdp_choice_stub for PrivateUse1; until then it is called directly.
# CPU has no kernel for it: the reference is CPU's math path.

fused = torch.ops.aten._scaled_dot_product_fused_attention_overrideable


def check_fused(shapes, dtype=torch.float32, bias=None, is_causal=False, scale=None):
    qkv = [make(s, dtype, seed=i) for i, s in enumerate(shapes)]
    leaves_c = [t.clone().requires_grad_() for t in qkv]
    leaves_t = [tpu(t).requires_grad_() for t in qkv]
    if bias is not None:
        leaves_c.append(bias.clone().requires_grad_())
        leaves_t.append(tpu(bias).requires_grad_())
    out_c = sdpa(*leaves_c[:3], attn_mask=leaves_c[3] if bias is not None else None,
                 is_causal=is_causal, scale=scale)
    res = fused(*leaves_t[:3], leaves_t[3] if bias is not None else None, 0.0, is_causal, False, scale=scale)
    out_t, lse_t = res[0], res[1]
    assert_same(out_t, out_c)
    # logsumexp of the scaled, masked scores, shaped (B, H, L) (B = 1 for 3-D inputs).
    q, k = (t.float() for t in qkv[:2])
    s = q @ k.transpose(-2, -1) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
    if bias is not None:
        s = s + bias.float()
    lse = torch.logsumexp(s, -1)
    assert_same(lse_t, lse.reshape(lse_t.shape), rtol=1e-4, atol=1e-4)
    assert res[4] == shapes[0][-2] and res[5] == shapes[1][-2]
    g = make(out_c.shape, dtype, seed=9)
    out_c.backward(g)
    out_t.backward(tpu(g))
    tol = dict(rtol=3e-2, atol=3e-2) if dtype == torch.bfloat16 else {}
    for a, e in zip(leaves_t, leaves_c):
        assert_same(a.grad, e.grad, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"scale": 0.3}], ids=["plain", "causal", "scale"])
def test_fused(kw, dtype):
    check_fused([(B, H, L, E), (B, H, S, E), (B, H, S, 5)], dtype, **kw)


@pytest.mark.parametrize("bias_shape", [(B, H, L, S), (B, 1, L, S), (L, S)])
def test_fused_bias_and_its_grad(bias_shape):
    check_fused(QKV, bias=make(bias_shape, seed=7))


def test_fused_3d_and_masked_rows():
    check_fused([(H, L, E), (H, S, E), (H, S, E)], is_causal=True)
    bias = make((L, S), seed=7)
    bias[2] = float("-inf")  # query 2 sees nothing: output row and its gradients are 0
    check_fused(QKV, bias=bias)


def test_fused_dropout():
    p, n = 0.3, 64
    q, k = make((2, 4, n, 16), seed=1), make((2, 4, n, 16), seed=2)
    v = torch.eye(n).expand(2, 4, n, n).contiguous()
    attn = sdpa(q, k, v)
    torch.manual_seed(0)
    qt, kt, vt = (tpu(t).requires_grad_() for t in (q, k, v))
    res = fused(qt, kt, vt, None, p)
    o = res[0].detach().cpu()
    kept = o != 0
    assert abs((1 - kept.float().mean().item()) - p) < 0.02
    torch.testing.assert_close(o[kept], (attn / (1 - p))[kept], rtol=1e-4, atol=1e-5)
    # The backward regenerates the same mask from (philox_seed, philox_offset).
    g = make(o.shape, seed=3)
    res[0].backward(tpu(g))
    torch.testing.assert_close(vt.grad.cpu(), o.transpose(-2, -1) @ g, rtol=1e-4, atol=1e-4)
    # d out / d q: the math-path gradient with the same dropout applied, i.e.
    # recomputed on CPU from the kept pattern.
    qc, kc = q.clone().requires_grad_(), k.clone().requires_grad_()
    probs = torch.softmax(qc @ kc.transpose(-2, -1) / 4.0, -1)
    ((probs * kept / (1 - p)) @ v).backward(g)
    torch.testing.assert_close(qt.grad.cpu(), qc.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kt.grad.cpu(), kc.grad, rtol=1e-4, atol=1e-4)
    torch.manual_seed(0)
    assert torch.equal(fused(tpu(q), tpu(k), tpu(v), None, p)[0].cpu(), o)


def test_fused_bad_input():
    q = tpu(make((B, 4, L, E)))
    kv = tpu(make((B, 2, S, E)))
    with pytest.raises(RuntimeError):  # grouped heads are not broadcast by this op
        fused(q, kv, kv)
    with pytest.raises(RuntimeError):  # PyTorch's Meta kernel: query must be 3-D or 4-D
        fused(tpu(make((L, E))), tpu(make((S, E))), tpu(make((S, E))))


@pytest.mark.parametrize("compiled", [False, True])
def test_sdpa_mask_that_does_not_broadcast_raises_cpus_error(compiled):
    # A decoder step's mask for 8 positions against a 42-slot cache (a plain
    # StaticCache given to Bart): CPU's broadcast error, not the builder's.
    q, kv = make((1, 4, 1, 8)), make((1, 4, 42, 8))
    mask = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    with pytest.raises(RuntimeError) as cpu_err:
        F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
    fn = F.scaled_dot_product_attention
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, backend="tpu")
    with pytest.raises(RuntimeError, match="size of tensor a \\(42\\) must match the size of tensor b \\(8\\)"):
        fn(tpu(q), tpu(kv), tpu(kv), attn_mask=tpu(mask)).cpu()
    assert "size of tensor a (42) must match the size of tensor b (8)" in str(cpu_err.value)


def test_sdpa_broadcasts_batches_and_rejects_mismatched_widths_as_cpu():
    # The fused op's Meta checks no sizes: batches that broadcast and widths
    # that differ take the math path, which broadcasts and raises as CPU
    # (the fused lowering raised, or the XLA compile failed).
    q, kv = make((2, 4, 3, 8)), make((1, 4, 5, 8), seed=1)
    qt, kvt = tpu(q).requires_grad_(), tpu(kv).requires_grad_()
    out = F.scaled_dot_product_attention(qt, kvt, kvt)
    q.requires_grad_(), kv.requires_grad_()
    want = F.scaled_dot_product_attention(q, kv, kv)
    assert_same(out, want)
    out.sum().backward()
    want.sum().backward()
    assert_same(qt.grad, q.grad)
    assert_same(kvt.grad, kv.grad)
    k6 = make((1, 4, 5, 6))
    with pytest.raises(RuntimeError, match="batch2 tensor to be: \\[4, 8\\] but got: \\[4, 6\\]"):
        F.scaled_dot_product_attention(tpu(make((1, 4, 3, 8))), tpu(k6), tpu(kv)).cpu()


def test_sdpa_takes_the_fused_lowering_for_4d_inputs(metrics_delta):
    # _fused_sdp_choice on tpu picks "overrideable": forward and backward are one program each.
    q = torch.randn(2, 2, 8, 4, device="tpu", requires_grad=True)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert out.grad_fn.name().startswith("ScaledDotProductFusedAttentionOverrideable")
    out.sum().backward()
    assert q.grad is not None and metrics_delta()["cpu_fallbacks"] == {}


def test_fused_sdp_choice_answers_for_tpu(metrics_delta):
    # torch._fused_sdp_choice on tpu tensors: what SDPA will use on tpu (it ran
    # CPU's kernel through the fallback and answered CPU's choice, flash).
    from torch.nn.attention import SDPBackend
    q = torch.rand(2, 2, 16, 8, dtype=torch.float16).to("tpu")
    assert torch._fused_sdp_choice(q, q, q) == int(SDPBackend.OVERRIDEABLE)
    assert torch._fused_sdp_choice(q[0], q[0], q[0]) == int(SDPBackend.MATH)  # 3-d: the math decomposition
    k = torch.rand(2, 1, 16, 8, dtype=torch.float16).to("tpu")
    assert torch._fused_sdp_choice(q, k, k, enable_gqa=True) == int(SDPBackend.MATH)
    assert metrics_delta()["cpu_fallbacks"] == {}


def test_fused_sdpa_does_not_wait_for_the_device(metrics_delta):
    # max_q/max_k are sizes the Meta kernel knows: returned without a device read.
    q = torch.randn(2, 2, 8, 4, device="tpu")
    torch.nn.functional.scaled_dot_product_attention(q, q, q)  # compile
    torch.tpu.synchronize()
    waits = metrics_delta()["host_waits"]
    for _ in range(3):
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert metrics_delta()["host_waits"] == waits


def test_fused_backward_with_an_undefined_output_gradient():
    # gradcheck's undefined-grad check (PyTorch's Transformer module tests): no
    # gradients, as CPU's math attention gives, not an error.
    q, k, v = (torch.randn(2, 2, 4, 8, dtype=torch.float64, device="tpu", requires_grad=True) for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    undefined = torch._C._functions.UndefinedGrad()(out)
    grads = torch.autograd.grad(undefined, (q, k, v), torch.ones_like(out), allow_unused=True)
    assert all(g is None for g in grads)


# ---- nn.MultiheadAttention / nn.TransformerEncoderLayer inference fast paths ----
# eval + no_grad takes torch._native_multi_head_attention and
# torch._transformer_encoder_layer_fwd (tpu is a supported fast-path device);
# they run on the device, their pieces lowered (no CPU fallback).

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["weights", "no_weights", "per_head", "padding_mask", "attn_mask"])
def test_multihead_attention_fast_path_on_device(kind, dtype, no_cpu_fallback):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval().to(dtype)
    x = torch.randn(3, 7, 32, dtype=dtype)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 4:] = True
    kw = {"weights": {}, "no_weights": {"need_weights": False}, "per_head": {"average_attn_weights": False},
          "padding_mask": {"key_padding_mask": pad}, "attn_mask": {"attn_mask": torch.ones(7, 7).bool().triu(1)}}[kind]
    with torch.no_grad():
        want = mha(x, x, x, **kw)
        got = mha.to("tpu")(*(tpu(x),) * 3, **{k: tpu(v) if torch.is_tensor(v) else v for k, v in kw.items()})
    tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    assert_same(got[0], want[0], **tol)
    if want[1] is not None:
        assert_same(got[1], want[1], **tol)


@pytest.mark.parametrize("activation,norm_first", [("relu", False), ("gelu", False), ("gelu", True)])
def test_transformer_encoder_layer_fast_path_on_device(activation, norm_first, no_cpu_fallback):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, activation=activation,
                                             norm_first=norm_first).eval()
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        want = layer(x)
        got = layer.to("tpu")(tpu(x))
    assert_same(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fast_path_pieces_match_cpu(dtype, no_cpu_fallback):
    torch.manual_seed(0)
    qkv, bias = torch.randn(2, 5, 24, dtype=dtype), torch.randn(24, dtype=dtype)
    assert_same(torch._transform_bias_rescale_qkv(tpu(qkv), tpu(bias), 4),
                torch._transform_bias_rescale_qkv(qkv, bias, 4))
    x = torch.randn(2, 3, 4, 4, dtype=dtype)
    pad = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)  # the second batch: every key masked
    causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
    for mask, mask_type in [(pad, 1), (causal, 0), (causal.expand(2, 3, 4, 4), 2)]:
        want = torch._masked_softmax(x, mask, -1, mask_type)
        assert_same(torch._masked_softmax(tpu(x), tpu(mask), -1, mask_type), want)
    assert torch.isnan(torch._masked_softmax(tpu(x), tpu(pad), -1, 1)[1].cpu()).all()  # NaN, as on CPU
    a, w, c = torch.randn(4, 6, dtype=dtype) * 3, torch.randn(6, 5, dtype=dtype), torch.randn(5, dtype=dtype)
    for use_gelu in (False, True):
        want = torch._addmm_activation(c, a, w, beta=0.5, alpha=2, use_gelu=use_gelu)
        assert_same(torch._addmm_activation(tpu(c), tpu(a), tpu(w), beta=0.5, alpha=2, use_gelu=use_gelu), want)


def test_sdpa_kernel_math_and_vmap_take_the_math_path():
    # sdpa_kernel([MATH]) turns the fused kernel off, and under vmap the fused
    # op has no batching rule ("Batching rule not implemented"): both take the
    # math decomposition, which matches CPU.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    q, k, v = (make((3, 2, 4, 8, 16), seed=s) for s in range(3))
    want = torch.vmap(F.scaled_dot_product_attention)(q, k, v)
    qt, kt, vt = tpu((q, k, v))
    with sdpa_kernel([SDPBackend.MATH]):
        assert torch._fused_sdp_choice(qt[0], kt[0], vt[0]) == int(SDPBackend.MATH)
        assert_same(F.scaled_dot_product_attention(qt[0], kt[0], vt[0]), F.scaled_dot_product_attention(q[0], k[0], v[0]))
    assert torch._fused_sdp_choice(qt[0], kt[0], vt[0]) == int(SDPBackend.OVERRIDEABLE)
    assert_same(torch.vmap(F.scaled_dot_product_attention)(qt, kt, vt), want)


@pytest.mark.parametrize("dtype,attr", [(torch.float32, "precision HIGHEST"), (torch.bfloat16, None),
                                        (torch.float16, "precision HIGH>")])
def test_attention_products_ask_for_the_inputs_precision(dtype, attr):
    # float32 attention takes torch's matmul precision ("highest"); bfloat16
    # attention's float32 probabilities need no more than one bfloat16 pass
    # on TPU (GPU flash kernels round them to bfloat16 too), float16's three.
    from torch_pjrt import _state
    if torch.get_float32_matmul_precision() != "highest":
        pytest.skip("another test changed the matmul precision")
    q = torch.randn(1, 2, 8, 4, device="tpu", dtype=dtype, requires_grad=True)
    _state.C.record_programs(True)
    try:
        F.scaled_dot_product_attention(q, q, q).sum().backward()
        q.grad.cpu()
    finally:
        _state.C.record_programs(False)
    texts = [t for name, t in _state.C.take_recorded_programs() if "attention" in name]
    assert len(texts) == 2  # forward and backward
    for t in texts:
        assert "stablehlo.dot_general" in t
        if attr:  # every dot asks for it, nothing else is asked for
            assert t.count(attr) == 2 * t.count("stablehlo.dot_general") == t.count("#stablehlo<precision ")
        else:
            assert "precision_config" not in t
