"""More Hugging Face decoder families on tpu against CPU: tiny random-weight
models (transformers 5.x classes, dropout off, vocab 100, hidden 32, 2 layers)
beyond those of tests/hf_families.py, with the same checks
(tests/test_hf_models.py): forward output and a training step for every
family, no op through the CPU fallback; greedy generation, fused-eager AdamW
training and torch.compile(backend="tpu") for some (their runtime: this file
stays under two minutes on two cores: ~50 s with the executable
cache warm, ~100 s of CPU time cold).

The families cover what the first set lacks: Mixture-of-Experts routing
(Mixtral: an integer torch.histc counts tokens per expert, then
torch._grouped_mm, lowered in csrc/lowering/ops/matmul.cpp; Qwen2-MoE,
Qwen3-MoE, OLMoE, DeepSeek-V3 and GPT-OSS route the same way), ALiBi (BLOOM, Falcon), partial and
interleaved rotary embeddings (Phi, GPT-NeoX, GPT-J, CodeGen, StableLM,
Persimmon), logit soft-capping and sliding windows (Gemma2, Gemma3, Cohere2,
Starcoder2, GPT-Neo), parallel attention/MLP blocks (Falcon, GPT-J, Cohere),
multi-query attention (GPT-BigCode), selective-scan state-space layers (Mamba)
and the RWKV recurrence."""

import pytest

pytest.importorskip("transformers")
import hf_families as hf  # noqa: E402
from hf_families import quiet_warnings  # noqa: E402, F401 (autouse in this module)
from hf_families import Family, _hf_loss, _ids, _seeded  # noqa: E402


def _families():
    import transformers as tf
    d = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             pad_token_id=0, eos_token_id=7, bos_token_id=1)
    tok = dict(pad_token_id=0, eos_token_id=7, bos_token_id=1)
    causal = dict(inputs=lambda: {"input_ids": _ids((2, 10)), "labels": _ids((2, 10))},
                  output=lambda o: o.logits, loss=_hf_loss, generates=True)

    def fam(name, cls, config):
        return Family(name, "transformers", _seeded(lambda: getattr(tf, cls)(config())), **causal)

    return [
        fam("Mixtral", "MixtralForCausalLM", lambda: tf.MixtralConfig(
            **d, num_local_experts=4, num_experts_per_tok=2)),
        fam("Qwen2-MoE", "Qwen2MoeForCausalLM", lambda: tf.Qwen2MoeConfig(
            **d, moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4,
            num_experts_per_tok=2)),
        fam("Qwen3-MoE", "Qwen3MoeForCausalLM", lambda: tf.Qwen3MoeConfig(
            **d, head_dim=8, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)),
        fam("OLMoE", "OlmoeForCausalLM", lambda: tf.OlmoeConfig(**d, num_experts=4, num_experts_per_tok=2)),
        fam("DeepSeek-V3", "DeepseekV3ForCausalLM", lambda: tf.DeepseekV3Config(
            vocab_size=100, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
            n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
            kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=4, v_head_dim=8, qk_nope_head_dim=4,
            max_position_embeddings=64, **tok)),
        fam("GPT-OSS", "GptOssForCausalLM", lambda: tf.GptOssConfig(
            vocab_size=100, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
            num_experts_per_tok=2, sliding_window=4, max_position_embeddings=64,
            layer_types=["sliding_attention", "full_attention"], **tok)),
        fam("Phi3", "Phi3ForCausalLM", lambda: tf.Phi3Config(
            **d, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)),
        fam("Phi", "PhiForCausalLM", lambda: tf.PhiConfig(
            **d, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)),
        fam("Falcon", "FalconForCausalLM", lambda: tf.FalconConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True,
            multi_query=False, hidden_dropout=0.0, attention_dropout=0.0, **tok)),
        fam("GPT-NeoX", "GPTNeoXForCausalLM", lambda: tf.GPTNeoXConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, hidden_dropout=0.0,
            attention_dropout=0.0, **tok)),
        fam("OPT", "OPTForCausalLM", lambda: tf.OPTConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
            max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, word_embed_proj_dim=32,
            **tok)),
        fam("BLOOM", "BloomForCausalLM", lambda: tf.BloomConfig(
            vocab_size=100, hidden_size=32, n_layer=2, n_head=4, hidden_dropout=0.0,
            attention_dropout=0.0, **tok)),
        fam("GPT-J", "GPTJForCausalLM", lambda: tf.GPTJConfig(
            vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_inner=64,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **tok)),
        fam("Gemma2", "Gemma2ForCausalLM", lambda: tf.Gemma2Config(
            **d, head_dim=8, sliding_window=4, query_pre_attn_scalar=8,
            attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
        fam("Gemma3", "Gemma3ForCausalLM", lambda: tf.Gemma3TextConfig(
            **d, head_dim=8, sliding_window=4, query_pre_attn_scalar=8)),
        fam("OLMo2", "Olmo2ForCausalLM", lambda: tf.Olmo2Config(**d)),
        fam("StableLM", "StableLmForCausalLM", lambda: tf.StableLmConfig(
            **d, hidden_dropout=0.0, attention_dropout=0.0)),
        fam("Starcoder2", "Starcoder2ForCausalLM", lambda: tf.Starcoder2Config(
            **d, residual_dropout=0.0, embedding_dropout=0.0, attention_dropout=0.0, sliding_window=4)),
        fam("Cohere", "CohereForCausalLM", lambda: tf.CohereConfig(**d)),
        fam("Mamba", "MambaForCausalLM", lambda: tf.MambaConfig(
            vocab_size=100, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
            conv_kernel=4, **tok)),
        fam("GPT-BigCode", "GPTBigCodeForCausalLM", lambda: tf.GPTBigCodeConfig(
            vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=64,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **tok)),
        fam("CodeGen", "CodeGenForCausalLM", lambda: tf.CodeGenConfig(
            vocab_size=100, n_positions=64, n_ctx=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
            n_inner=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **tok)),
        fam("GPT-Neo", "GPTNeoForCausalLM", lambda: tf.GPTNeoConfig(
            vocab_size=100, max_position_embeddings=64, hidden_size=32, num_layers=2, num_heads=4,
            attention_types=[[["global", "local"], 1]], window_size=4, intermediate_size=64,
            resid_dropout=0.0, embed_dropout=0.0, attention_dropout=0.0, **tok)),
        fam("Persimmon", "PersimmonForCausalLM", lambda: tf.PersimmonConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=64, hidden_dropout=0.0,
            attention_dropout=0.0, **tok)),
        fam("Granite", "GraniteForCausalLM", lambda: tf.GraniteConfig(
            **d, embedding_multiplier=2.0, logits_scaling=4.0, residual_multiplier=0.5,
            attention_multiplier=0.1)),
        fam("Cohere2", "Cohere2ForCausalLM", lambda: tf.Cohere2Config(**d, sliding_window=4)),
        fam("RWKV", "RwkvForCausalLM", lambda: tf.RwkvConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
            intermediate_size=64, context_length=64, **tok)),
    ]


FAMILIES = {f.name: f for f in _families()}
NAMES = list(FAMILIES)
# Generation (8 greedy tokens, a program per new length) for a sample of the
# mechanisms: ALiBi, soft-capping + sliding window, the Mamba scan, interleaved
# rotary, expert routing.
GENERATES = ["BLOOM", "Gemma2", "Mamba", "GPT-J", "Mixtral"]


@pytest.mark.parametrize("name", NAMES)
def test_forward_matches_cpu(name):
    hf.assert_forward_matches(FAMILIES[name])


@pytest.mark.parametrize("name", NAMES)
def test_training_step_matches_cpu(name):
    hf.assert_train_step_matches(FAMILIES[name])


@pytest.mark.parametrize("name", GENERATES)
def test_greedy_generate_equals_cpu(name):
    hf.assert_generate_equals(FAMILIES[name])


@pytest.mark.parametrize("name", ["BLOOM"])
def test_fused_adamw_training_matches_cpu(name):
    """Six AdamW steps in fused eager (clip, loss.item() each step): CPU's losses."""
    r = hf.check_fused_training(FAMILIES[name])
    assert r["fallbacks"] == []
    assert r["loss_rel_err"] <= hf.LOSS_RTOL, r


# Mixtral: aten::_grouped_mm in float32 through Dynamo's FakeTensors
# (torch_pjrt/_grouped_mm_meta.py); it runs op by op between compiled pieces.
@pytest.mark.parametrize("name", ["BLOOM", "Mixtral"])
def test_compiled_forward_matches_cpu(name):
    r = hf.check_compiled_forward(FAMILIES[name])
    assert r["fallbacks"] == [] and r["eager_graph_fallbacks"] == 0, r
    assert r["rel_err"] <= hf.FORWARD_RTOL, r
