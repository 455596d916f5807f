"""accelerate / transformers pick tpu without flags (torch_pjrt/integrations/hf.py).

Tiny models built from configs (no downloads): GPT-2 with 2 layers, 32 wide,
a 100-token vocabulary, dropout off so tpu and CPU runs are comparable.
"""
import os

import pytest
import torch

from conftest import DEVICE

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

from torch_pjrt.integrations import install  # noqa: E402

install()   # also done by `import torch_pjrt`; repeated calls are no-ops

from accelerate import Accelerator, PartialState  # noqa: E402
from accelerate.state import AcceleratorState  # noqa: E402

VOCAB = 100
CHARS = "abcdefghijklmnopqrstuvwxyz .,!?"


@pytest.fixture(autouse=True)
def _fresh_accelerate_state(monkeypatch):
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def tiny_config():
    return transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=64,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                   bos_token_id=0, eos_token_id=1, pad_token_id=1)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(tiny_config()).eval()


def tiny_tokenizer():
    """Character-level fast tokenizer built in memory (ids < VOCAB)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2}
    vocab.update({c: i + 3 for i, c in enumerate(CHARS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>", pad_token="</s>")


# accelerate ---------------------------------------------------------------------------------

def test_accelerator_device_is_tpu():
    assert Accelerator().device.type == DEVICE
    AcceleratorState._reset_state(reset_partial_state=True)
    assert PartialState().device.type == DEVICE


def test_accelerator_cpu_true_stays_cpu():
    assert Accelerator(cpu=True).device.type == "cpu"


def test_accelerate_env_override_wins(monkeypatch):
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu")
    assert Accelerator().device.type == "cpu"


def test_accelerator_prepare_moves_model_and_batches():
    acc = Accelerator()
    model = torch.nn.Linear(4, 2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    model, loader = acc.prepare(model, loader)
    assert model.weight.device.type == DEVICE
    (batch,) = next(iter(loader))
    assert batch.device.type == DEVICE


def _one_rank_launch(monkeypatch):
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for k, v in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("preset", [None, "cpu"])
def test_distributed_launch_uses_the_tpu_backend_unless_a_device_is_preset(monkeypatch, preset):
    """A torchrun-style environment (here one rank): DDP's kind on the "tpu"
    backend (tests/test_hf_distributed.py runs two); ACCELERATE_TORCH_DEVICE=cpu
    keeps accelerate's own choice."""
    import torch.distributed as dist
    _one_rank_launch(monkeypatch)
    if preset:
        monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", preset)
    try:
        state = PartialState()
        if preset is None:
            assert (str(state.distributed_type), state.backend) == ("DistributedType.MULTI_GPU", "tpu")
            assert state.device == torch.device(DEVICE, 0) and dist.get_backend() == "tpu"
        else:
            assert str(state.distributed_type) == "DistributedType.NO" and state.device.type == "cpu"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# TrainingArguments / Trainer ------------------------------------------------------------------

def test_training_arguments_device(tmp_path):
    args = transformers.TrainingArguments(str(tmp_path), report_to=[])
    assert args.device.type == DEVICE
    args = transformers.TrainingArguments(str(tmp_path), report_to=[], use_cpu=True)
    assert args.device.type == "cpu"


def _train(tmp_path, model, use_cpu, steps=4, **extra):
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, VOCAB, (16, 12), generator=g)]
    args = transformers.TrainingArguments(
        str(tmp_path), use_cpu=use_cpu, max_steps=steps, per_device_train_batch_size=4, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", report_to=[], seed=0, data_seed=0,
        dataloader_num_workers=0, disable_tqdm=True, **extra)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == steps
    return trainer, losses


def test_trainer_matches_cpu_and_keeps_model_on_tpu(tmp_path):
    cpu_model = tiny_model().train()
    tpu_model = tiny_model().train().to(DEVICE)
    _, cpu_losses = _train(tmp_path / "cpu", cpu_model, use_cpu=True)
    trainer, tpu_losses = _train(tmp_path / "tpu", tpu_model, use_cpu=False)
    assert trainer.args.device.type == DEVICE
    assert {p.device.type for p in tpu_model.parameters()} == {DEVICE}
    assert {p.device.type for p in cpu_model.parameters()} == {"cpu"}
    # float32, 4 AdamW steps: XLA's CPU kernels round differently from ATen's.
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-5)
    for (n, a), (_, b) in zip(tpu_model.named_parameters(), cpu_model.named_parameters()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-3, atol=1e-4, msg=n)


def test_trainer_bf16_on_tpu(tmp_path):
    """TrainingArguments(bf16=True) raised "Your setup doesn't support bf16/gpu"
    (transformers asks named devices only); on tpu it trains under bfloat16
    autocast, as CPU's bf16 run does."""
    args = transformers.TrainingArguments(str(tmp_path / "args"), report_to=[], bf16=True)
    assert args.device.type == DEVICE
    cpu_model = tiny_model().train()
    tpu_model = tiny_model().train().to(DEVICE)
    _, cpu_losses = _train(tmp_path / "cpu", cpu_model, use_cpu=True, bf16=True)
    _, tpu_losses = _train(tmp_path / "tpu", tpu_model, use_cpu=False, bf16=True)
    _, fp32_losses = _train(tmp_path / "fp32", tiny_model().train().to(DEVICE), use_cpu=False)
    # bfloat16 matmuls: within bf16's precision of CPU's bf16 run, and not
    # the float32 run (autocast did take effect).
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=2e-2, atol=0)
    assert tpu_losses != fp32_losses


def _train_resumed(tmp_path, use_cpu):
    """2 steps with a checkpoint, then a new Trainer resumes from it to step 4."""
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, VOCAB, (16, 12), generator=g)]

    def trainer(steps):
        args = transformers.TrainingArguments(
            str(tmp_path), use_cpu=use_cpu, max_steps=steps, per_device_train_batch_size=2, learning_rate=1e-3,
            logging_steps=1, save_strategy="steps", save_steps=2, report_to=[], seed=0, disable_tqdm=True)
        model = tiny_model().train()
        return transformers.Trainer(model=model if use_cpu else model.to(DEVICE), args=args, train_dataset=data)

    trainer(2).train()
    resumed = trainer(4)
    resumed.train(resume_from_checkpoint=True)
    losses = [h["loss"] for h in resumed.state.log_history if "loss" in h]
    return losses, {k: v.detach().cpu() for k, v in resumed.model.state_dict().items()}


def test_trainer_resume_from_checkpoint_matches_cpu(tmp_path):
    """The checkpoint holds tpu tensors (weights, AdamW state) and the RNG and
    scheduler states; resuming from it on tpu gives what resuming does on CPU."""
    cpu_losses, cpu_weights = _train_resumed(tmp_path / "cpu", use_cpu=True)
    tpu_losses, tpu_weights = _train_resumed(tmp_path / "tpu", use_cpu=False)
    assert len(tpu_losses) == 4 and os.path.isdir(tmp_path / "tpu" / "checkpoint-4")
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-5)
    for name, w in tpu_weights.items():
        torch.testing.assert_close(w, cpu_weights[name], rtol=1e-3, atol=1e-4, msg=name)


def test_trainer_moves_cpu_model_to_tpu(tmp_path):
    model = tiny_model().train()
    trainer, _ = _train(tmp_path, model, use_cpu=False, steps=2)
    assert {p.device.type for p in trainer.model.parameters()} == {DEVICE}


# pipeline --------------------------------------------------------------------------------------

def _generate(pipe):
    out = pipe("hello", max_new_tokens=5, do_sample=False)
    return out[0]["generated_text"]


@pytest.fixture(scope="module")
def cpu_text():
    pipe = transformers.pipeline("text-generation", model=tiny_model(), tokenizer=tiny_tokenizer(), device="cpu")
    return _generate(pipe)


def test_pipeline_keeps_tpu_model_without_device(cpu_text):
    model = tiny_model().to(DEVICE)
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=tiny_tokenizer())
    assert pipe.device.type == DEVICE
    assert {p.device.type for p in model.parameters()} == {DEVICE}
    assert _generate(pipe) == cpu_text


def test_pipeline_device_tpu(cpu_text):
    pipe = transformers.pipeline("text-generation", model=tiny_model(), tokenizer=tiny_tokenizer(), device=DEVICE)
    assert pipe.device.type == DEVICE
    assert pipe.model.device.type == DEVICE
    assert _generate(pipe) == cpu_text


def test_pipeline_cpu_model_without_device_goes_to_tpu():
    pipe = transformers.pipeline("text-generation", model=tiny_model(), tokenizer=tiny_tokenizer())
    assert pipe.device.type == DEVICE and pipe.model.device.type == DEVICE


def test_pipeline_device_cpu_stays_cpu():
    for device in ("cpu", -1):
        pipe = transformers.pipeline("text-generation", model=tiny_model(), tokenizer=tiny_tokenizer(),
                                     device=device)
        assert pipe.device.type == "cpu" and pipe.model.device.type == "cpu"


# device_map="auto" ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_gpt2")
    tiny_model().save_pretrained(path)
    return path


def test_get_max_memory_lists_tpu_devices():
    from accelerate.utils import get_max_memory
    mem = get_max_memory()
    n = torch.tpu.device_count()
    assert [k for k in mem if isinstance(k, int)] == list(range(n))
    assert mem[0] == pytest.approx(torch.tpu.mem_get_info(0)[0], rel=0.05)
    assert "cpu" in mem
    # An explicit budget is the user's: left as given.
    assert get_max_memory({"cpu": 1000}) == {"cpu": 1000}


def _assert_logits_equal(model, saved_model):
    ref = transformers.GPT2LMHeadModel.from_pretrained(saved_model)
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids.to(DEVICE)).logits.cpu()
        want = ref(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device_map", ["auto", "balanced", "sequential"])
def test_device_map_places_on_tpu(saved_model, device_map):
    model = transformers.GPT2LMHeadModel.from_pretrained(saved_model, device_map=device_map)
    # One device: transformers loads onto it without dispatch hooks (no hf_device_map).
    assert set(getattr(model, "hf_device_map", {"": 0}).values()) <= set(range(torch.tpu.device_count()))
    assert {p.device.type for p in model.parameters()} == {DEVICE}
    _assert_logits_equal(model, saved_model)


def _split_model(saved_model):
    """Sequential plan over two tpu devices (the model is 123 KB; tpu:0 gets 90 KB): hooks move activations."""
    model = transformers.GPT2LMHeadModel.from_pretrained(
        saved_model, device_map="sequential", max_memory={0: 90_000, 1: 10**9, "cpu": 10**9})
    assert set(model.hf_device_map.values()) == {0, 1}, model.hf_device_map
    assert {p.device for p in model.parameters()} == {torch.device(DEVICE, 0), torch.device(DEVICE, 1)}
    return model


@pytest.mark.skipif(torch.tpu.device_count() < 2, reason="needs two tpu devices (TORCH_PJRT_CPU_DEVICES=2)")
def test_device_map_split_over_two_tpu_devices(saved_model):
    import logging
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    log = logging.getLogger("accelerate.utils.modeling")
    log.addHandler(handler)
    try:
        model = _split_model(saved_model)
    finally:
        log.removeHandler(handler)
    assert not [m for m in seen if "is not available" in m]
    _assert_logits_equal(model, saved_model)


@pytest.mark.skipif(torch.tpu.device_count() < 2, reason="needs two tpu devices (TORCH_PJRT_CPU_DEVICES=2)")
def test_pipeline_with_dispatched_model(saved_model, cpu_text):
    pipe = transformers.pipeline("text-generation", model=_split_model(saved_model), tokenizer=tiny_tokenizer())
    assert pipe.device == torch.device(DEVICE, 0)
    assert _generate(pipe) == cpu_text


def test_pipeline_with_device_map_auto(saved_model, cpu_text):
    pipe = transformers.pipeline("text-generation", model=str(saved_model), tokenizer=tiny_tokenizer(),
                                 device_map="auto")
    assert pipe.device.type == DEVICE and pipe.model.device.type == DEVICE
    assert _generate(pipe) == cpu_text


@pytest.mark.parametrize("where", [DEVICE, "tpu:1", 0])
def test_load_checkpoint_and_dispatch_onto_a_tpu_device(tmp_path, where):
    """device_map={"": "tpu"} as one writes {"": "cuda"}: accelerate hands the
    device to stock safetensors, which torch_pjrt's integration lets load onto tpu."""
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    from safetensors.torch import save_file
    want = torch.device(DEVICE, where) if isinstance(where, int) else torch.device(where)
    if want.index is not None and want.index >= torch.tpu.device_count():
        pytest.skip("needs a second tpu device")

    def build():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))

    torch.manual_seed(0)
    ref = build()
    save_file(ref.state_dict(), tmp_path / "m.safetensors", metadata={"format": "pt"})
    with init_empty_weights():
        empty = build()
    model = load_checkpoint_and_dispatch(empty, str(tmp_path / "m.safetensors"), device_map={"": where})
    assert {p.device for p in model.parameters()} == {want if want.index is not None else torch.device(DEVICE, 0)}
    x = torch.randn(3, 8)
    torch.testing.assert_close(model(x.to(want)).cpu(), ref(x), rtol=1e-6, atol=1e-6)


def test_import_torch_pjrt_does_not_import_hf():
    import subprocess
    import sys
    code = ("import sys, torch_pjrt; from torch_pjrt.integrations import install; install(); "
            "print(sorted(m for m in ('transformers', 'accelerate', 'safetensors') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
