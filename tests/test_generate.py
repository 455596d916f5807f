"""Hugging Face generate() on tpu stays on the device: greedy decoding of a
tiny random GPT-2 equals CPU's, with no op through the CPU fallback (the
end-of-sequence check is aten::isin)."""
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")


def test_greedy_generate_matches_cpu_without_fallback(no_cpu_fallback):
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64,
                                  eos_token_id=7, bos_token_id=7)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    ref = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    out = model.to("tpu").generate(ids.to("tpu"), max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert out.device.type == "tpu"
    assert torch.equal(out.cpu(), ref)


def test_sampled_generate_stays_on_device(no_cpu_fallback):
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64,
                                  eos_token_id=7, bos_token_id=7)
    model = transformers.GPT2LMHeadModel(cfg).eval().to("tpu")
    ids = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(1)).to("tpu")
    torch.manual_seed(5)
    a = model.generate(ids, max_new_tokens=8, do_sample=True, top_k=20, top_p=0.9, temperature=0.8, pad_token_id=0)
    torch.manual_seed(5)
    b = model.generate(ids, max_new_tokens=8, do_sample=True, top_k=20, top_p=0.9, temperature=0.8, pad_token_id=0)
    assert a.shape[1] > 5 and torch.equal(a.cpu(), b.cpu())  # seeded: the same sample
    assert ((a >= 0) & (a < 100)).all()
