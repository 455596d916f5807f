"""Integrations of the tpu device with libraries that choose a device themselves.

`install()` is the one entry point (called from torch_pjrt/__init__.py). It
imports none of those libraries: it registers post-import hooks (see
`_hooks`) so each library is adjusted when, and only if, the program imports
it. TORCH_PJRT_HF_INTEGRATION=0 turns the Hugging Face adjustments off.

- `hf`: accelerate / transformers pick tpu where they would fall back to CPU
  (Accelerator().device, TrainingArguments.device and so Trainer, pipeline()
  without device=, device_map="auto", bf16=True), and under torchrun run DDP
  over the "tpu" c10d backend where each rank would have run alone. Why each
  is a narrow patch and which upstream change removes it:
  docs/upstream_notes.md.
- `safetensors`: load_file / safe_open / save_file for tpu tensors
  (safetensors 0.8 rejects device="tpu"); when safetensors is imported, its
  stock safe_open / load_file / load_model accept tpu devices too (patch_stock).
"""
import os

_installed = False


def install():
    """Registers the library integrations (idempotent, imports nothing heavy)."""
    global _installed
    if _installed:
        return
    _installed = True
    if os.environ.get("TORCH_PJRT_HF_INTEGRATION", "1").strip().lower() not in ("0", "false", "no", "off"):
        from . import hf, _hooks
        hf.install()
        _hooks.when_imported("safetensors", _patch_safetensors)


def _patch_safetensors(module):
    from . import safetensors
    safetensors.patch_stock()
