"""Hugging Face model directories as workloads (`assess --hf DIR`): causal
LMs are assessed in generation mode (greedy, fixed prompts), other models in
inference mode. Prompts come from the directory's tokenizer when it has one,
else fixed token ids (the same on every run)."""
import os

import torch

from .workload import Workload

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "In 1905, Albert Einstein published four papers that",
    "def fibonacci(n):",
    "The capital of France is",
    "Translate to German: The weather is nice today.",
    "Once upon a time, in a small village,",
    "import torch\nmodel =",
    "The three primary colors are",
]
PROMPT_TOKENS = 12


def _token_ids(directory, config, batch_size):
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(directory)
    except Exception:  # noqa: BLE001  (no tokenizer files: fixed ids)
        tok = None
    if tok is not None:
        raw = [tok(PROMPTS[i % len(PROMPTS)])["input_ids"][:PROMPT_TOKENS] for i in range(batch_size)]
        width = max(len(r) for r in raw)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        # Left padding, as generation wants.
        ids = [[pad] * (width - len(r)) + r for r in raw]
        mask = [[0] * (width - len(r)) + [1] * len(r) for r in raw]
        return torch.tensor(ids), torch.tensor(mask)
    g = torch.Generator().manual_seed(0)
    vocab = int(getattr(config, "vocab_size", 1000))
    ids = torch.randint(1, vocab, (batch_size, PROMPT_TOKENS), generator=g)
    return ids, torch.ones_like(ids)


def workload(directory, batch_sizes=(1, 2, 4), max_new_tokens=8):
    from transformers import AutoConfig
    directory = os.path.abspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"--hf {directory}: not a directory")
    config = AutoConfig.from_pretrained(directory)
    causal = any(a.endswith("ForCausalLM") for a in (config.architectures or []))

    def model():
        from transformers import AutoModel, AutoModelForCausalLM
        torch.manual_seed(0)
        cls = AutoModelForCausalLM if causal else AutoModel
        return cls.from_pretrained(directory, dtype=torch.float32)

    def make_inputs(batch_size):
        ids, mask = _token_ids(directory, config, batch_size)
        return {"input_ids": ids, "attention_mask": mask}

    name = os.path.basename(directory.rstrip("/")) or "hf-model"
    return Workload(name=name, model=model, make_inputs=make_inputs,
                    mode="generation" if causal else "inference", batch_sizes=tuple(batch_sizes),
                    max_new_tokens=max_new_tokens, source=f"--hf {directory}", source_paths=[])


def make_tiny_llama(directory, vocab=128, seed=0):
    """A tiny random-weight Llama saved to `directory` (demo and tests: no
    downloads)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    from transformers.utils import logging as hf_logging
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # (a "Writing model shards" bar for a 1-file model is noise)
    try:
        LlamaForCausalLM(cfg).save_pretrained(directory)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return directory
