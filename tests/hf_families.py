"""Tiny random-weight Hugging Face / diffusers models, one per family, and the
checks run on each against CPU (tests/test_hf_models.py runs them as tests,
scripts/gen_hf_doc.py writes their figures into docs/huggingface.md).

Every model is built from a small config with dropout off, so CPU and tpu run
the same function from the same weights."""
import contextlib
import copy
import dataclasses
import warnings
from typing import Callable

import pytest
import torch

import torch_pjrt


@pytest.fixture(autouse=True)
def quiet_warnings():
    """The model families' own deprecation and config warnings, hidden (a test
    module that imports this fixture uses it for each of its tests)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@dataclasses.dataclass
class Family:
    name: str          # the family as users know it
    library: str       # "transformers" or "diffusers"
    build: Callable    # () -> model (CPU, seeded)
    inputs: Callable   # () -> dict of CPU inputs (the forward's keyword arguments)
    output: Callable   # model output -> the tensor compared (logits, sample)
    loss: Callable     # (model output, inputs) -> scalar loss for the training step
    generates: bool = False


def _ids(shape, vocab=100, seed=1):
    return torch.randint(1, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _image(shape, seed=2):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _hf_loss(out, inputs):
    return out.loss


def _mse_to_zero(out, inputs):
    return out.sample.float().pow(2).mean()


def _seeded(fn):
    def build():
        torch.manual_seed(0)
        return fn()
    return build


def _families():
    import transformers as tf
    decoder = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                   pad_token_id=0, eos_token_id=7, bos_token_id=1)
    causal = dict(inputs=lambda: {"input_ids": _ids((2, 10)), "labels": _ids((2, 10))},
                  output=lambda o: o.logits, loss=_hf_loss, generates=True)
    fams = [
        Family("GPT-2", "transformers", _seeded(lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
            n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, eos_token_id=7, bos_token_id=1, pad_token_id=0))), **causal),
        Family("Llama", "transformers", _seeded(lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**decoder))), **causal),
        Family("Qwen2", "transformers", _seeded(lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**decoder))), **causal),
        Family("Qwen3", "transformers", _seeded(lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(
            head_dim=8, **decoder))), **causal),
        Family("Mistral", "transformers", _seeded(lambda: tf.MistralForCausalLM(tf.MistralConfig(**decoder))),
               **causal),
        Family("Gemma", "transformers", _seeded(lambda: tf.GemmaForCausalLM(tf.GemmaConfig(
            head_dim=8, **decoder))), **causal),
        Family("BERT", "transformers", _seeded(lambda: tf.BertForMaskedLM(tf.BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))),
               inputs=lambda: {"input_ids": _ids((2, 10)), "attention_mask": torch.ones(2, 10, dtype=torch.long),
                               "labels": _ids((2, 10), seed=3)},
               output=lambda o: o.logits, loss=_hf_loss),
        Family("T5", "transformers", _seeded(lambda: tf.T5ForConditionalGeneration(tf.T5Config(
            vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=7))),
               inputs=lambda: {"input_ids": _ids((2, 10)), "labels": _ids((2, 6), seed=3)},
               output=lambda o: o.logits, loss=_hf_loss, generates=True),
        Family("Whisper", "transformers", _seeded(lambda: tf.WhisperForConditionalGeneration(tf.WhisperConfig(
            vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
            max_source_positions=16, max_target_positions=32, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0, decoder_start_token_id=1, pad_token_id=0, eos_token_id=7,
            bos_token_id=1))),
               inputs=lambda: {"input_features": _image((2, 8, 32)), "labels": _ids((2, 6), seed=3)},
               output=lambda o: o.logits, loss=_hf_loss),
        Family("ViT", "transformers", _seeded(lambda: tf.ViTForImageClassification(tf.ViTConfig(
            image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=64, num_labels=5, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0))),
               inputs=lambda: {"pixel_values": _image((2, 3, 16, 16)), "labels": torch.tensor([1, 3])},
               output=lambda o: o.logits, loss=_hf_loss),
        Family("ResNet", "transformers", _seeded(lambda: tf.ResNetForImageClassification(tf.ResNetConfig(
            num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5))),
               inputs=lambda: {"pixel_values": _image((2, 3, 32, 32)), "labels": torch.tensor([1, 3])},
               output=lambda o: o.logits, loss=_hf_loss),
    ]
    try:
        import diffusers as df
    except ImportError:
        return fams
    unet_blocks = dict(block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4)
    fams += [
        Family("UNet2D", "diffusers", _seeded(lambda: df.UNet2DModel(
            sample_size=16, in_channels=3, out_channels=3, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"), attention_head_dim=4, **unet_blocks)),
               inputs=lambda: {"sample": _image((2, 3, 16, 16)), "timestep": torch.tensor([10, 500])},
               output=lambda o: o.sample, loss=_mse_to_zero),
        Family("UNet2DCondition", "diffusers", _seeded(lambda: df.UNet2DConditionModel(
            sample_size=16, in_channels=4, out_channels=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
            attention_head_dim=2, **unet_blocks)),
               inputs=lambda: {"sample": _image((2, 4, 16, 16)), "timestep": torch.tensor([10, 500]),
                               "encoder_hidden_states": _image((2, 5, 16), seed=4)},
               output=lambda o: o.sample, loss=_mse_to_zero),
        Family("AutoencoderKL", "diffusers", _seeded(lambda: df.AutoencoderKL(
            in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, sample_size=16, **unet_blocks)),
               inputs=lambda: {"sample": _image((2, 3, 16, 16))},
               output=lambda o: o.sample, loss=_mse_to_zero),
    ]
    return fams


FAMILIES = {f.name: f for f in _families()}


def _to(x, device):
    """x with its tensors (in dicts, lists and tuples too) moved to device."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device) for v in x)
    return x


def _fallbacks():
    return dict(torch_pjrt.metrics()["cpu_fallbacks"])


def _new_fallbacks(before):
    after = _fallbacks()
    return sorted(op for op, n in after.items() if n != before.get(op, 0))


def _max_rel(a, e):
    """max |a - e| over max |e| (a relative error of the whole tensor)."""
    a, e = a.detach().cpu().double(), e.detach().double()
    return float((a - e).abs().max() / e.abs().max().clamp_min(1e-12))


def check_forward(fam):
    """Forward in eval mode on both devices: (relative error of the output, fallbacks)."""
    model = fam.build().eval()
    inputs = fam.inputs()
    with torch.no_grad():
        ref = fam.output(model(**inputs))
        before = _fallbacks()
        out = fam.output(model.to("tpu")(**_to(inputs, "tpu")))
    assert out.device.type == "tpu"
    return {"rel_err": _max_rel(out, ref), "fallbacks": _new_fallbacks(before)}


def check_train_step(fam, lr=0.1):
    """loss, backward, an SGD step and the loss after it, on both devices from the
    same weights: relative errors of both losses and the worst gradient."""
    cpu_model = fam.build().train()
    tpu_model = copy.deepcopy(cpu_model)
    inputs = fam.inputs()
    figures, before = {}, _fallbacks()
    results = []
    for model, device in ((cpu_model, "cpu"), (tpu_model.to("tpu"), "tpu")):
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        batch = _to(inputs, device)
        loss = fam.loss(model(**batch), batch)
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        opt.step()
        with torch.no_grad():
            loss_after = fam.loss(model(**batch), batch)
        results.append((loss.detach(), grads, loss_after))
    (l0, g0, a0), (l1, g1, a1) = results
    assert len(g0) == len(g1) and l1.device.type == "tpu"
    figures["loss_rel_err"] = _max_rel(l1, l0)
    # Per parameter, relative to its largest CPU gradient, but never to less than
    # 1e-3 of the largest gradient of the model: some gradients are zero in exact
    # arithmetic (attention key biases: softmax ignores a constant shift) and
    # both devices give rounding noise of ~1e-13 there.
    floor = 1e-3 * max(float(g.abs().max()) for g in g0)
    figures["grad_rel_err"] = max(float((b.cpu().double() - a.double()).abs().max())
                                  / max(float(a.abs().max()), floor) for a, b in zip(g0, g1))
    figures["loss_after_step_rel_err"] = _max_rel(a1, a0)
    figures["fallbacks"] = _new_fallbacks(before)
    return figures


def check_fused_training(fam, steps=6):
    """AdamW steps (clip, loss.item() after each step) on CPU and in fused
    eager on tpu from the same weights: the worst relative loss error, the
    pipelined cuts learned and flushes at them."""
    import torch_pjrt

    cpu_model = fam.build().train()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    inputs = fam.inputs()
    # Cuts are learned per trace and kept: an earlier run of the same model in
    # this process (the suite under TORCH_PJRT_EAGER=fused) would have learned them.
    torch_pjrt.clear_executable_cache()
    before, m0 = _fallbacks(), torch_pjrt.metrics()
    losses = []
    for model, device in ((cpu_model, "cpu"), (tpu_model, "tpu")):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = _to(inputs, device)
        out = []
        with torch_pjrt.fused() if device == "tpu" else contextlib.nullcontext():
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                loss = fam.loss(model(**batch), batch)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                out.append(loss.item())
        losses.append(out)
    m1 = torch_pjrt.metrics()
    return {"loss_rel_err": max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(*losses)),
            "cuts": m1["fused_pipeline_cuts_learned"] - m0["fused_pipeline_cuts_learned"],
            "pipeline_flushes": m1["fused_flushes_by_reason"].get("pipeline", 0)
            - m0["fused_flushes_by_reason"].get("pipeline", 0),
            "fallbacks": _new_fallbacks(before)}


def check_generate(fam, new_tokens=8, **generate_kw):
    """Greedy generate on both devices (`generate_kw` added on both): tokens
    equal, fallbacks, and what torch.compile did on tpu meanwhile (metrics)."""
    model = fam.build().eval()
    ids = _ids((2, 5), seed=5)
    kw = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, **generate_kw)
    ref = model.generate(ids, **kw)
    before = _fallbacks()
    m0 = torch_pjrt.metrics()
    out = model.to("tpu").generate(ids.to("tpu"), **kw)
    assert out.device.type == "tpu"
    m1 = torch_pjrt.metrics()
    return {"equal": bool(torch.equal(out.cpu(), ref)), "tokens": int(out.shape[-1]),
            "fallbacks": _new_fallbacks(before),
            **{k: m1[k] - m0[k] for k in ("dynamo_graphs", "compiled_graph_runs", "eager_graph_fallbacks")}}


def check_compiled_forward(fam):
    """torch.compile(model, backend="tpu") forward in eval mode against CPU eager:
    relative error, fallbacks, and what Dynamo did (metrics)."""
    model = fam.build().eval()
    inputs = fam.inputs()
    m0, before = torch_pjrt.metrics(), _fallbacks()
    with torch.no_grad():
        ref = fam.output(model(**inputs))
        torch._dynamo.reset()
        compiled = torch.compile(model.to("tpu"), backend="tpu")
        out = fam.output(compiled(**_to(inputs, "tpu")))
    m1 = torch_pjrt.metrics()
    assert out.device.type == "tpu"
    return {"rel_err": _max_rel(out, ref), "fallbacks": _new_fallbacks(before),
            **{k: m1[k] - m0[k] for k in ("dynamo_graphs", "compiled_graph_runs", "eager_graph_fallbacks")}}


# The assertions the test files make of each check (no op through the CPU fallback).
def assert_forward_matches(fam):
    r = check_forward(fam)
    assert r["fallbacks"] == []
    assert r["rel_err"] <= FORWARD_RTOL, r


def assert_train_step_matches(fam):
    r = check_train_step(fam)
    assert r["fallbacks"] == []
    assert r["loss_rel_err"] <= LOSS_RTOL, r
    assert r["grad_rel_err"] <= GRAD_RTOL, r
    assert r["loss_after_step_rel_err"] <= LOSS_RTOL, r


def assert_generate_equals(fam, **generate_kw):
    r = check_generate(fam, **generate_kw)
    assert r["fallbacks"] == []
    assert r["equal"], r
    return r


# Tolerances (relative to the largest magnitude of the CPU tensor); float32 throughout.
FORWARD_RTOL = 1e-4
GRAD_RTOL = 1e-3
LOSS_RTOL = 1e-4
