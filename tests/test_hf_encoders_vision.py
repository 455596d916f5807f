"""Tiny random-weight Hugging Face encoder, encoder-decoder, vision and audio
families, and timm image models, on tpu against CPU: eval forward, a training
step (loss, gradients, the loss after an SGD step), greedy generation for
seq2seq models, torch.compile(backend="tpu") and fused eager, with no op
through the CPU fallback. The checks are tests/hf_families.py's; the families
here are the ones tests/test_hf_models.py does not cover. The timm models run
only where timm imports (it is not in requirements.txt); no weights are
downloaded anywhere (configs only, pretrained=False)."""
import contextlib
import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
import hf_families as hf  # noqa: E402
from hf_families import quiet_warnings  # noqa: E402, F401 (autouse in this module)
from hf_families import Family, _ids, _image, _hf_loss, _seeded  # noqa: E402

import torch_pjrt  # noqa: E402

_NO_DROP = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_ENC = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, **_NO_DROP)


def _mlm_inputs():
    return {"input_ids": _ids((2, 10)),
            "attention_mask": torch.tensor([[1] * 10, [1] * 7 + [0] * 3]),
            "labels": _ids((2, 10), seed=3)}


def _image_inputs(size, labels=(1, 3)):
    return lambda: {"pixel_values": _image((2, 3, size, size)), "labels": torch.tensor(labels)}


_mlm = dict(inputs=_mlm_inputs, output=lambda o: o.logits, loss=_hf_loss)


def _seq2seq(name, cfg_cls, model_cls):
    import transformers as tf
    cfg = getattr(tf, cfg_cls)(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, bos_token_id=1,
        eos_token_id=7, decoder_start_token_id=2, forced_eos_token_id=None)
    return Family(name, "transformers", _seeded(lambda: getattr(tf, model_cls)(cfg)),
                  inputs=lambda: {"input_ids": _ids((2, 10)), "attention_mask": torch.ones(2, 10, dtype=torch.long),
                                  "labels": _ids((2, 6), seed=3)},
                  output=lambda o: o.logits, loss=_hf_loss, generates=True)


def _wav2vec2():
    import transformers as tf
    torch.manual_seed(0)
    return tf.Wav2Vec2ForCTC(tf.Wav2Vec2Config(
        vocab_size=20, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, feat_extract_norm="group", hidden_dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
        layerdrop=0.0, mask_time_prob=0.0, pad_token_id=0, ctc_loss_reduction="mean"))


def _logits_nll(out, inputs):
    """A loss without labels: the mean negative log-likelihood of token 1."""
    return -out.logits.float().log_softmax(-1)[..., 1].mean()


def _hf_families():
    import transformers as tf
    fams = [
        Family("RoBERTa", "transformers", _seeded(lambda: tf.RobertaForMaskedLM(tf.RobertaConfig(
            pad_token_id=1, **_ENC))), **_mlm),
        Family("DistilBERT", "transformers", _seeded(lambda: tf.DistilBertForMaskedLM(tf.DistilBertConfig(
            vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64,
            dropout=0.0, attention_dropout=0.0))), **_mlm),
        Family("DeBERTa-v2", "transformers", _seeded(lambda: tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(
            relative_attention=True, position_buckets=8, max_relative_positions=16,
            pos_att_type=["p2c", "c2p"], **_ENC))), **_mlm),
        Family("ALBERT", "transformers", _seeded(lambda: tf.AlbertForMaskedLM(tf.AlbertConfig(
            embedding_size=16, classifier_dropout_prob=0.0, **_ENC))), **_mlm),
        Family("ELECTRA", "transformers", _seeded(lambda: tf.ElectraForPreTraining(tf.ElectraConfig(
            embedding_size=16, **_ENC))),
               inputs=lambda: {"input_ids": _ids((2, 10)), "attention_mask": torch.ones(2, 10, dtype=torch.long),
                               "labels": _ids((2, 10), vocab=2, seed=3)},
               output=lambda o: o.logits, loss=_hf_loss),
        _seq2seq("BART", "BartConfig", "BartForConditionalGeneration"),
        _seq2seq("Pegasus", "PegasusConfig", "PegasusForConditionalGeneration"),
        _seq2seq("mBART", "MBartConfig", "MBartForConditionalGeneration"),
        Family("CLIP", "transformers", _seeded(lambda: tf.CLIPModel(tf.CLIPConfig(
            text_config=dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, max_position_embeddings=16, attention_dropout=0.0),
            vision_config=dict(image_size=16, patch_size=4, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4, attention_dropout=0.0),
            projection_dim=16))),
               inputs=lambda: {"input_ids": _ids((2, 8)), "pixel_values": _image((2, 3, 16, 16)),
                               "return_loss": True},
               output=lambda o: o.logits_per_image, loss=_hf_loss),
        Family("Swin", "transformers", _seeded(lambda: tf.SwinForImageClassification(tf.SwinConfig(
            image_size=32, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4,
            mlp_ratio=2.0, drop_path_rate=0.0, num_labels=5, **_NO_DROP))),
               inputs=_image_inputs(32), output=lambda o: o.logits, loss=_hf_loss),
        Family("ConvNeXt", "transformers", _seeded(lambda: tf.ConvNextForImageClassification(tf.ConvNextConfig(
            hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32, num_labels=5,
            drop_path_rate=0.0))),
               inputs=_image_inputs(32), output=lambda o: o.logits, loss=_hf_loss),
        Family("SegFormer", "transformers", _seeded(lambda: tf.SegformerForSemanticSegmentation(tf.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3],
            strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=5,
            classifier_dropout_prob=0.0, drop_path_rate=0.0, **_NO_DROP))),
               inputs=lambda: {"pixel_values": _image((2, 3, 32, 32)),
                               "labels": _ids((2, 32, 32), vocab=5, seed=3) - 1},
               output=lambda o: o.logits, loss=_hf_loss),
        Family("Wav2Vec2", "transformers", _wav2vec2,
               inputs=lambda: {"input_values": _image((2, 400))},
               output=lambda o: o.logits, loss=_logits_nll),
        Family("MobileNetV2", "transformers", _seeded(lambda: tf.MobileNetV2ForImageClassification(
            tf.MobileNetV2Config(image_size=32, depth_multiplier=0.25, output_stride=8, initializer_range=0.25,
                                 num_labels=5, classifier_dropout_prob=0.0))),
               inputs=_image_inputs(32), output=lambda o: o.logits, loss=_hf_loss),
        Family("DINOv2", "transformers", _seeded(lambda: tf.Dinov2ForImageClassification(tf.Dinov2Config(
            image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            mlp_ratio=2, num_labels=5, drop_path_rate=0.0, **_NO_DROP))),
               inputs=_image_inputs(24), output=lambda o: o.logits, loss=_hf_loss),
        Family("BEiT", "transformers", _seeded(lambda: tf.BeitForImageClassification(tf.BeitConfig(
            image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, num_labels=5, use_relative_position_bias=True, use_mean_pooling=True,
            layer_scale_init_value=0.1, drop_path_rate=0.0, **_NO_DROP))),
               inputs=_image_inputs(16), output=lambda o: o.logits, loss=_hf_loss),
        Family("DETR", "transformers", _seeded(lambda: _DetrWithTensorLabels(tf.DetrForObjectDetection(tf.DetrConfig(
            use_timm_backbone=False, use_pretrained_backbone=False,
            backbone_config=tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                            out_features=["stage2"]),
            num_queries=4, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.0,
            attention_dropout=0.0, activation_dropout=0.0, num_labels=5, auxiliary_loss=False)))),
               inputs=lambda: {"pixel_values": _image((2, 3, 32, 32)), "class_labels": torch.tensor([[1, 3], [2, 4]]),
                               "boxes": torch.tensor([[[0.3, 0.4, 0.2, 0.3], [0.6, 0.6, 0.3, 0.2]],
                                                      [[0.5, 0.5, 0.4, 0.4], [0.2, 0.7, 0.2, 0.2]]])},
               output=lambda o: o.logits, loss=_hf_loss),
    ]
    return fams


class _DetrWithTensorLabels(torch.nn.Module):
    """DETR taking its targets as tensors (two boxes per image), so the checks
    move them to the device like any other input."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values, class_labels, boxes):
        labels = [{"class_labels": c, "boxes": b} for c, b in zip(class_labels, boxes)]
        return self.model(pixel_values=pixel_values, labels=labels)


class _TimmClassifier(torch.nn.Module):
    """A timm model with the families' calling convention (pixel_values, labels)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values, labels=None):
        return self.model(pixel_values)


def _timm(name, size=32, **kw):
    def build():
        import timm
        torch.manual_seed(0)
        return _TimmClassifier(timm.create_model(name, pretrained=False, num_classes=5, drop_rate=0.0, **kw))
    return Family(f"timm:{name}", "timm", build, inputs=_image_inputs(size), output=lambda o: o,
                  loss=lambda out, inputs: F.cross_entropy(out, inputs["labels"]))


def _timm_families():
    return [
        _timm("resnet18", channels=(8, 16, 32, 64), stem_width=8),
        _timm("vit_tiny_patch16_224", img_size=32, depth=2),
        _timm("convnext_atto"),
        _timm("efficientnet_b0", output_stride=8),
        _timm("mobilenetv3_small_050", size=64),
    ]


FAMILIES = {f.name: f for f in _hf_families()}
try:
    import timm  # noqa: F401
    FAMILIES.update({f.name: f for f in _timm_families()})
except ImportError:
    pass


def check_fused_backward(fam):
    """Forward and backward in fused eager (torch_pjrt.fused()) against CPU:
    relative errors of the loss and the worst gradient (as check_train_step)."""
    cpu_model = fam.build().train()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    inputs = fam.inputs()
    before, results, m0 = hf._fallbacks(), [], torch_pjrt.metrics()
    for model, device in ((cpu_model, "cpu"), (tpu_model, "tpu")):
        batch = hf._to(inputs, device)
        with torch_pjrt.fused() if device == "tpu" else contextlib.nullcontext():
            loss = fam.loss(model(**batch), batch)
            loss.backward()
        results.append((loss.detach(), [p.grad.detach().cpu() for p in model.parameters() if p.grad is not None]))
    (l0, g0), (l1, g1) = results
    m1 = torch_pjrt.metrics()
    assert len(g0) == len(g1)
    floor = 1e-3 * max(float(g.abs().max()) for g in g0)
    return {"loss_rel_err": hf._max_rel(l1, l0),
            "grad_rel_err": max(float((b.double() - a.double()).abs().max()) / max(float(a.abs().max()), floor)
                                for a, b in zip(g0, g1)),
            "ops_recorded": m1["fused_ops_recorded"] - m0["fused_ops_recorded"],
            "flushes": m1["fused_flushes"] - m0["fused_flushes"],
            "fallbacks": hf._new_fallbacks(before)}


NAMES = list(FAMILIES)
GENERATES = [n for n in NAMES if FAMILIES[n].generates]


@pytest.mark.parametrize("name", NAMES)
def test_forward_matches_cpu(name):
    hf.assert_forward_matches(FAMILIES[name])


# Depthwise-conv nets with batch norm in train mode amplify float32 rounding:
# their gradients differ from CPU's by ~1e-4 and the loss after an SGD step by
# up to ~1e-3 (lr 0.1 and 0.01 alike). In float64 both devices agree to ~1e-12,
# so their training step is checked in float64.
TRAIN_IN_FLOAT64 = {"MobileNetV2", "timm:efficientnet_b0"}


def _float64(fam):
    return dataclasses.replace(fam, build=lambda: fam.build().double(), inputs=lambda: {
        k: v.double() if v.is_floating_point() else v for k, v in fam.inputs().items()})


@pytest.mark.parametrize("name", NAMES)
def test_training_step_matches_cpu(name):
    fam = FAMILIES[name]
    hf.assert_train_step_matches(_float64(fam) if name in TRAIN_IN_FLOAT64 else fam)


@pytest.mark.parametrize("name", GENERATES)
def test_greedy_generate_equals_cpu(name):
    hf.assert_generate_equals(FAMILIES[name])


@pytest.mark.parametrize("name", ["DeBERTa-v2", "Swin", "CLIP", "timm:convnext_atto"])
def test_compiled_forward_matches_cpu(name):
    if name not in FAMILIES:
        pytest.skip("timm is not installed")
    r = hf.check_compiled_forward(FAMILIES[name])
    assert r["fallbacks"] == [] and r["eager_graph_fallbacks"] == 0, r
    assert r["dynamo_graphs"] >= 1 and r["compiled_graph_runs"] >= 1, r
    assert r["rel_err"] <= hf.FORWARD_RTOL, r


@pytest.mark.parametrize("name", ["Swin", "SegFormer", "Wav2Vec2", "DETR"])
def test_fused_forward_backward_matches_cpu(name):
    r = check_fused_backward(FAMILIES[name])
    assert r["fallbacks"] == [] and r["ops_recorded"] > 0 and r["flushes"] >= 1, r
    assert r["loss_rel_err"] <= hf.LOSS_RTOL, r
    assert r["grad_rel_err"] <= hf.GRAD_RTOL, r


@pytest.mark.xfail(strict=True, reason="aten::_ctc_loss and aten::_ctc_loss_backward have no lowering "
                   "(a dynamic program over time: it needs a stablehlo.while loop, whose body the lowering "
                   "Builder cannot emit; it emits single-op reduce/scatter regions only): they run on the CPU fallback")
def test_wav2vec2_ctc_training_step_without_fallback():
    fam = Family("Wav2Vec2-CTC", "transformers", _wav2vec2,
                 inputs=lambda: {"input_values": _image((2, 400)), "labels": _ids((2, 5), vocab=20, seed=3)},
                 output=lambda o: o.logits, loss=_hf_loss)
    r = hf.check_train_step(fam)
    assert r["loss_rel_err"] <= hf.LOSS_RTOL and r["grad_rel_err"] <= hf.GRAD_RTOL, r
    assert r["fallbacks"] == [], r
