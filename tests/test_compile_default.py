"""torch.compile with no backend on tpu (graphs go to backend="tpu", not to
Inductor's Pallas target), and flex_attention on tpu: eager (its math path),
compiled, backward, and through transformers' attn_implementation."""
import math
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch_pjrt
from conftest import assert_same


def _graphs():
    return torch_pjrt.metrics()["compiled_graphs"]


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.LayerNorm(8),
                               torch.nn.Linear(8, 3))


def test_compile_without_backend_runs_through_tpu_backend(no_cpu_fallback):
    torch._dynamo.reset()
    ref_model, x = _mlp(), torch.randn(4, 6)
    ref = ref_model(x)
    ref.sum().backward()
    model = _mlp().to("tpu")
    before = _graphs()
    out = torch.compile(model)(x.to("tpu"))
    out.sum().backward()
    assert _graphs() > before  # forward and backward compiled by backend="tpu"
    assert_same(out.detach(), ref.detach())
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert_same(p.grad, q.grad)


def test_compile_inductor_by_name_and_mode_on_tpu():
    torch._dynamo.reset()
    x = torch.randn(5, 7)

    def f(a):
        return torch.softmax(a * 2, -1).sum(0) + torch.ones(7, device=a.device)
    for kwargs in ({"backend": "inductor"}, {"mode": "max-autotune-no-cudagraphs"}, {"dynamic": False}):
        before = _graphs()
        out = torch.compile(f, **kwargs)(x.to("tpu"))
        assert _graphs() == before + 1, kwargs
        assert_same(out, f(x))
        torch._dynamo.reset()


def test_graph_that_only_creates_tpu_tensors():
    torch._dynamo.reset()

    def f(n: int):
        return torch.arange(6, device="tpu").float().reshape(2, 3) * n
    before = _graphs()
    out = torch.compile(f)(3)
    assert _graphs() == before + 1
    assert torch.equal(out.cpu(), torch.arange(6).float().reshape(2, 3) * 3)


def test_cpu_graphs_still_go_to_inductor():
    torch._dynamo.reset()
    before = _graphs()
    x = torch.randn(8)
    out = torch.compile(lambda a: (a.sin() + 1).sum())(x)
    assert _graphs() == before  # not ours
    assert torch.allclose(out, (x.sin() + 1).sum(), rtol=1e-5, atol=1e-5)


def _causal(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


def _reference(q, k, v):
    """Causal attention in float64 (the math flex_attention defines)."""
    q, k, v = (t.double() for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    return torch.softmax(s.masked_fill(~mask, -float("inf")), -1) @ v


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 16, 8, generator=g) for _ in range(3)]


@pytest.fixture(autouse=False)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        yield


def test_flex_attention_eager_score_mod_and_block_mask(quiet, no_cpu_fallback):
    q, k, v = _qkv()
    ref = _reference(q, k, v).float()
    out = flex_attention(*(t.to("tpu") for t in (q, k, v)), score_mod=_causal)
    assert out.device.type == "tpu"
    assert_same(out, ref)
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 16, 16, device="tpu")
    assert_same(flex_attention(*(t.to("tpu") for t in (q, k, v)), block_mask=mask), ref)
    torch.testing.assert_close(flex_attention(q, k, v, score_mod=_causal), ref, rtol=1e-5, atol=1e-5)  # CPU unchanged


def test_flex_attention_backward_matches_float64(quiet):
    q, k, v = _qkv(1)
    leaves = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    flex_attention(*leaves, score_mod=_causal).pow(2).sum().backward()
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    _reference(*ref_leaves).pow(2).sum().backward()
    for a, e in zip(leaves, ref_leaves):
        assert_same(a.grad, e.grad.float(), rtol=1e-4, atol=1e-5)


def test_flex_attention_compiled_on_tpu(quiet):
    torch._dynamo.reset()
    q, k, v = _qkv(2)
    before = _graphs()
    for fn in (torch.compile(flex_attention, backend="tpu"), torch.compile(flex_attention)):
        out = fn(*(t.to("tpu") for t in (q, k, v)), score_mod=_causal)
        assert_same(out, _reference(q, k, v).float())
    assert _graphs() >= before + 2


def test_flex_attention_still_refuses_other_devices(quiet):
    q, k, v = (t.to("meta") for t in _qkv())
    with pytest.raises(ValueError, match="FlexAttention is only supported"):
        flex_attention(q, k, v)


def test_transformers_flex_attention_llama_equals_cpu(quiet, no_cpu_fallback):
    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    ref_model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = ref_model(ids).logits
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="flex_attention")
    model.load_state_dict(ref_model.state_dict())
    model = model.to("tpu").eval()
    before = _graphs()
    with torch.no_grad():
        out = model(ids.to("tpu")).logits
    assert _graphs() > before  # transformers compiles flex_attention with the default backend
    assert_same(out, ref, rtol=1e-4, atol=1e-5)
