"""accelerate and the Trainer under torchrun on tpu (torch_pjrt/integrations/hf.py,
patch 5): with no device or backend named, 2 ranks train a tiny GPT-2 with
DDP on tpu:0 and tpu:1 over torch_pjrt's "tpu" c10d backend, and reach one
CPU process's losses and weights with the global batch. Without the patch
each rank ran alone (num_processes 1, no DDP), which these tests catch."""
import importlib.util
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "fixtures", "hf_dist_worker.py")
WORLD = 2
TIMEOUT = 300

_spec = importlib.util.spec_from_file_location("hf_dist_worker", WORKER)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(scenario, out):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TORCH_PJRT_CPU_DEVICES=str(WORLD))
    for name in ("ACCELERATE_TORCH_DEVICE", "ACCELERATE_USE_CPU", "LOCAL_RANK", "RANK", "WORLD_SIZE"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
         "--master-addr", "127.0.0.1", "--master-port", str(_port()), WORKER, scenario, str(out)],
        env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.load(open(out / f"rank{r}.json")) for r in range(WORLD)]
    return ranks, torch.load(out / "weights.pt") if (out / "weights.pt").exists() else None


@pytest.fixture(scope="module")
def cpu_reference():
    return worker.reference()


@pytest.fixture(scope="module")
def cpu_trainer_reference(tmp_path_factory):
    from accelerate.state import AcceleratorState
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        seen, model = worker.with_trainer(str(tmp_path_factory.mktemp("cpu_trainer")), use_cpu=True,
                                          batch=worker.PER_RANK_BATCH * WORLD)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert seen["param_devices"] == ["cpu"], seen
    return seen["losses"], model.state_dict()


def _assert_matches(losses, weights, cpu_reference):
    cpu_losses, cpu_weights = cpu_reference
    # float32, 4 AdamW steps; the global batch's mean loss is averaged over
    # the ranks' halves (equal token counts), as DDP averages the gradients.
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-5)
    assert weights.keys() == cpu_weights.keys()
    for name, w in weights.items():
        torch.testing.assert_close(w, cpu_weights[name], rtol=1e-3, atol=1e-4, msg=name)


def test_accelerator_under_torchrun_trains_ddp_on_tpu(tmp_path, cpu_reference):
    ranks, weights = torchrun("accelerate", tmp_path)
    for r, seen in enumerate(ranks):
        assert seen["device"] == f"tpu:{r}", seen
        assert seen["distributed_type"] == "MULTI_GPU", seen
        assert seen["backend"] == "tpu", seen
        assert (seen["num_processes"], seen["process_index"]) == (WORLD, r), seen
        assert seen["wrapped"] == "DistributedDataParallel", seen
        assert seen["batch_devices"] == [f"tpu:{r}"], seen
        assert seen["restored"] and seen["restored_devices"] == [f"tpu:{r}"], seen   # save_state / load_state
    assert ranks[0]["losses"] == ranks[1]["losses"]
    _assert_matches(ranks[0]["losses"], weights, cpu_reference)


def test_trainer_under_torchrun_trains_ddp_on_tpu(tmp_path, cpu_trainer_reference):
    ranks, weights = torchrun("trainer", tmp_path)
    for r, seen in enumerate(ranks):
        assert seen["device"] == f"tpu:{r}", seen
        assert seen["parallel_mode"] == "DISTRIBUTED", seen
        assert (seen["world_size"], seen["process_index"]) == (WORLD, r), seen
        assert seen["wrapped"] == "DistributedDataParallel", seen
        assert seen["param_devices"] == [f"tpu:{r}"], seen
        assert seen["predicted"] == [7, 12, worker.VOCAB], seen       # every example once, in order
    assert ranks[0]["eval_loss"] == ranks[1]["eval_loss"]
    _assert_matches(ranks[0]["losses"], weights, cpu_trainer_reference)


def test_accelerator_fsdp2_under_torchrun_trains_sharded_on_tpu(tmp_path, cpu_reference):
    """accelerate's FSDP2 (fully_shard) on tpu: parameters sharded as DTensors,
    the full state dict gathered (all_gather_into_tensor, coalesced)."""
    ranks, weights = torchrun("fsdp", tmp_path)
    for r, seen in enumerate(ranks):
        assert seen["device"] == f"tpu:{r}", seen
        assert seen["distributed_type"] == "FSDP", seen
        assert (seen["num_processes"], seen["process_index"]) == (WORLD, r), seen
        assert seen["wrapped"].startswith("FSDP"), seen
        assert seen["sharded"] == ["DTensor"], seen
    assert ranks[0]["losses"] == ranks[1]["losses"]
    _assert_matches(ranks[0]["losses"], weights, cpu_reference)


def test_transformers_tensor_parallel_under_torchrun(tmp_path):
    """from_pretrained(tp_plan="auto") starts torch.distributed itself with
    TorchTPU's backend name ("tpu_dist", an alias of "tpu" here); the
    sharded model's logits equal the whole model's on CPU."""
    import transformers
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(worker.tiny_llama_config()).eval()
    model.save_pretrained(tmp_path / "llama")
    with torch.no_grad():
        want = model(worker.token_ids()[:2]).logits
    ranks, _ = torchrun("tp", tmp_path)
    for r, seen in enumerate(ranks):
        assert seen["device"] == f"tpu:{r}" and seen["backend"] == "tpu_dist", seen
        assert "DTensor" in seen["sharded"], seen
        torch.testing.assert_close(torch.tensor(seen["logits"]), want, rtol=1e-5, atol=1e-5)
