"""Hugging Face model directories as workloads (`assess --hf DIR`): causal
LMs are assessed in generation mode (greedy, fixed prompts), other models in
inference mode, each with the class named in config.architectures (else
AutoModel / AutoModelForCausalLM; the report's source says which). Prompts
come from the directory's tokenizer when it has a usable one, else fixed
token ids (the same on every run); vision and audio models get fixed random
images, waveforms or features shaped by their config."""
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


def usable_tokenizer(tok):
    """Whether `tok` makes real token ids of the prompts. transformers 5
    returns, for a directory without tokenizer files, a tokenizer with an
    empty (or special-tokens-only) vocabulary instead of raising: its ids were
    (batch, 0) or all UNK, and the model saw no prompt."""
    if tok is None:
        return False
    try:
        if len(tok) == 0:
            return False
        encoded = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    except Exception:  # noqa: BLE001  (a tokenizer that cannot encode is not usable)
        return False
    if any(len(e) == 0 for e in encoded):
        return False
    unk = getattr(tok, "unk_token_id", None)
    return not all(i == unk for e in encoded for i in e)


def _token_ids(directory, config, batch_size):
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(directory)
    except Exception:  # noqa: BLE001  (no tokenizer files: fixed ids)
        tok = None
    if usable_tokenizer(tok):
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
    cls_name = model_class_name(config, causal)
    causal = causal or _generates_text(cls_name)

    def model():
        import transformers
        torch.manual_seed(0)
        return getattr(transformers, cls_name).from_pretrained(directory, dtype=torch.float32)

    main_input = _main_input(cls_name)

    def make_inputs(batch_size):
        if main_input != "input_ids":
            return {main_input: _signal(config, main_input, batch_size)}
        ids, mask = _token_ids(directory, config, batch_size)
        return {"input_ids": ids, "attention_mask": mask}

    name = os.path.basename(directory.rstrip("/")) or "hf-model"
    return Workload(name=name, model=model, make_inputs=make_inputs,
                    mode="generation" if causal else "inference", batch_sizes=tuple(batch_sizes),
                    max_new_tokens=max_new_tokens, source=f"--hf {directory} (loaded as {cls_name})",
                    source_paths=[])


def model_class_name(config, causal=False):
    """The transformers class to load: the first of config.architectures that
    transformers has (a saved BertForSequenceClassification keeps its head;
    AutoModel dropped it and "top-1 agreement" was an argmax over the hidden
    size), else AutoModelForCausalLM / AutoModel."""
    import transformers
    for name in config.architectures or []:
        try:
            cls = getattr(transformers, name, None)
        except Exception:  # noqa: BLE001  (a lazy import that fails: not this class)
            cls = None
        if isinstance(cls, type) and hasattr(cls, "from_pretrained"):
            return name
    return "AutoModelForCausalLM" if causal else "AutoModel"


def _main_input(cls_name):
    """The input the class's forward takes first: input_ids (text),
    pixel_values (ViT, ConvNeXT, ResNet...), input_values (Wav2Vec2, HuBERT),
    input_features (Whisper)."""
    import transformers
    name = getattr(getattr(transformers, cls_name, None), "main_input_name", None)
    return name if name in ("pixel_values", "input_values", "input_features") else "input_ids"


def _sub_config(config, *keys):
    for k in keys:
        for c in (config, getattr(config, "vision_config", None), getattr(config, "audio_config", None)):
            v = getattr(c, k, None) if c is not None else None
            if v is not None:
                return v
    return None


def _signal(config, main_input, batch_size):
    """Fixed random images or audio shaped as the config says (the same on
    every run): there is no processor to make them from real data."""
    g = torch.Generator().manual_seed(0)
    if main_input == "pixel_values":
        size = _sub_config(config, "image_size") or 224
        h, w = (size, size) if isinstance(size, int) else (size[0], size[1])
        channels = _sub_config(config, "num_channels") or 3
        return torch.randn(batch_size, channels, h, w, generator=g)
    if main_input == "input_values":  # one second of 16 kHz audio
        return torch.randn(batch_size, 16000, generator=g)
    # input_features: log-mel frames; Whisper wants exactly 2 * max_source_positions of them
    mels = _sub_config(config, "num_mel_bins") or 80
    frames = 2 * (_sub_config(config, "max_source_positions") or 1500)
    return torch.randn(batch_size, mels, frames, generator=g)


def _generates_text(cls_name):
    """Whether the class generates from token ids or audio features
    (GPT2LMHeadModel, T5 or Bart ForConditionalGeneration, Whisper): names
    alone miss these."""
    import transformers
    cls = getattr(transformers, cls_name, None)
    try:
        return bool(cls.can_generate()) and getattr(cls, "main_input_name", None) in ("input_ids", "input_features")
    except Exception:  # noqa: BLE001  (an Auto class or an old one without can_generate)
        return False


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
