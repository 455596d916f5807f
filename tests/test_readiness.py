"""TPU readiness without a TPU (torch_pjrt.readiness): programs compiled by
libtpu for named topologies on this machine, which has no TPU. Figures are
checked against what they must be (2*M*N*K flops for a matmul, memory
growing with batch, a model that cannot fit one chip but fits four), not
against numbers written down."""
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch
import torch.nn as nn

import torch_pjrt.readiness as readiness
from torch_pjrt.readiness import core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import models  # noqa: E402

pytestmark = pytest.mark.skipif(not readiness.available(), reason="libtpu is not installed (pip install libtpu)")

GIB = 2**30
# Memory per chip libtpu's topologies report (device_memory_bytes_limit).
CHIP_MEMORY = {"v5e:2x2": 16_909_334_528, "v6e:2x2": 33_550_235_648}


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    env.update(extra)
    return env


# ---- figures of plain programs --------------------------------------------------------------

@pytest.mark.parametrize("topology", ["v5e:2x2", "v6e:2x2"])
def test_matmul_flops_are_2mnk(topology):
    M, N, K = 512, 384, 256
    a, b = torch.randn(M, K), torch.randn(K, N)
    r = readiness.check(lambda x, y: x @ y, (a, b), topology=topology)
    assert r.memory_per_chip == CHIP_MEMORY[topology]
    assert len(r.programs) == 1
    assert r.step_flops == pytest.approx(2 * M * N * K, rel=0.05)
    # Bytes accessed: at least both operands and the result, once.
    assert r.step_bytes_accessed >= 4 * (M * K + K * N + M * N) * 0.95
    assert r.fits and r.margin_bytes == r.memory_per_chip - r.step_peak_bytes
    p = r.programs[0]
    assert p.arithmetic_intensity == pytest.approx(p.flops / p.bytes_accessed)
    assert p.estimate_seconds > 0 and p.bound in ("compute", "memory")
    assert "HloModule" in p.hlo_text


def test_float32_matmul_precision_reaches_the_tpu_compiler():
    # libtpu's optimized HLO: "highest" (PyTorch's default) keeps float32
    # operands at full precision, "high" asks for 3 bfloat16 passes, "medium"
    # lets the TPU compiler round them to bfloat16 (one MXU pass).
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    before = torch.get_float32_matmul_precision()
    hlo = {}
    try:
        for setting in ("highest", "high", "medium"):
            torch.set_float32_matmul_precision(setting)
            hlo[setting] = readiness.check(lambda x, y: x @ y, (a, b), topology="v5e:2x2").programs[0].hlo_text
    finally:
        torch.set_float32_matmul_precision(before)
    assert "operand_precision={highest,highest}" in hlo["highest"]
    assert "operand_precision={high,high}" in hlo["high"]
    assert "operand_precision" not in hlo["medium"] and "bf16" in hlo["medium"]


def test_peak_grows_with_batch():
    model = models.MLP()
    peaks = [readiness.check(model, (torch.randn(b, 32),), topology="v5e:2x2").step_peak_bytes
             for b in (1024, 8192, 65536)]
    assert peaks[0] < peaks[1] < peaks[2], peaks
    # Activations dominate at these sizes: 8x the batch, several times the peak.
    assert peaks[2] > 4 * peaks[1]


def test_bad_topology_and_chips_are_clear_errors():
    with pytest.raises(ValueError, match="no TPU topology .v9q:2x2."):
        readiness.check(lambda x: x + 1, (torch.ones(4),), topology="v9q:2x2")
    with pytest.raises(ValueError, match="8 chips asked, topology v5e:2x2 has 4 devices"):
        readiness.check(lambda x: x + 1, (torch.ones(8),), topology="v5e:2x2", chips=8)
    with pytest.raises(ValueError, match="mode"):
        readiness.check(lambda x: x + 1, (torch.ones(8),), mode="serving")


# ---- the shipped models on two topologies ---------------------------------------------------

@pytest.mark.parametrize("topology", ["v5e:2x2", "v6e:2x2"])
def test_gpt_training_step(topology, tmp_path):
    cfg = models.GPTConfig()
    x, y = models.gpt_batch(0, batch=8)
    model = models.GPT(cfg)
    r = readiness.check(model, (x, y), topology=topology, mode="training",
                        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3), save_dir=str(tmp_path))
    phases = {p.phase for p in r.programs}
    assert {"forward", "backward", "optimizer step"} <= phases, phases
    assert r.fits and r.memory_per_chip == CHIP_MEMORY[topology]
    # Weights, gradients and two Adam moments stay in memory through the step.
    n_params = sum(p.numel() for p in model.parameters())
    assert r.step_peak_bytes >= 4 * 4 * n_params
    # A transformer's training step is about 6 flops per parameter per token (forward 2, backward 4).
    tokens = x.numel()
    assert 4 * n_params * tokens < r.step_flops < 20 * n_params * tokens, (r.step_flops, n_params, tokens)
    assert r.step_estimate_seconds > 0
    d = r.to_dict()
    json.dumps(d)
    assert "estimate" in d["estimate"] and "hlo_text" not in d["programs"][0]
    # Serialized executables (what a real TPU of this generation would load) and the scheduled HLO.
    saved = sorted(os.listdir(tmp_path))
    assert len([f for f in saved if f.endswith(".pjrtexe")]) == len(r.programs)
    assert all(os.path.getsize(tmp_path / f) > 1000 for f in saved)
    assert any(f.endswith(".hlo.txt") for f in saved)


@pytest.mark.parametrize("topology", ["v5e:2x2", "v6e:2x2"])
def test_cnn_inference(topology):
    x = models.cnn_batch(0, batch=16)[0]
    r = readiness.check(models.SmallCNN(), (x,), topology=topology)
    assert r.fits and r.mode == "inference" and r.batch_size == 16
    assert [p.phase for p in r.programs] == ["forward"]
    assert r.step_flops > 0 and r.step_bytes_accessed > 0
    assert r.generation == topology.split(":")[0]
    # The roofline figure is the larger of compute time and memory time at the published peaks.
    p = r.programs[0]
    assert p.estimate_seconds == pytest.approx(
        max(p.flops / r.peak_flops_per_device, p.bytes_accessed / r.bandwidth_per_device))


def test_v6e_estimate_faster_than_v5e_for_same_program():
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    e5 = readiness.check(lambda x, y: x @ y, (a, b), topology="v5e:2x2").step_estimate_seconds
    e6 = readiness.check(lambda x, y: x @ y, (a, b), topology="v6e:2x2").step_estimate_seconds
    assert e6 < e5


def test_eager_op_programs_compile_for_a_topology():
    a = torch.randn(64, 32, device="tpu")
    b = torch.randn(32, 16, device="tpu")
    progs = readiness.eager_programs(lambda: torch.relu(a @ b + 1.0))
    assert any("mm" in p.name for p in progs), [p.name for p in progs]
    r = readiness.check_eager(lambda: a @ b, topology="v5e:2x2")
    mm = [p for p in r.programs if "mm" in p.name]
    assert mm and mm[0].flops == pytest.approx(2 * 64 * 32 * 16, rel=0.05)


# ---- too big for one chip, fits on four -----------------------------------------------------

class WideMLP(nn.Module):
    def __init__(self, width=4096, layers=3):
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])

    def forward(self, x):
        return self.layers(x)


def test_too_big_for_one_chip_fits_on_four():
    width, batch = 4096, 1 << 19  # each activation 8 GiB: input + one hidden exceed a v5e chip's 15.75 GiB
    model = WideMLP(width)
    x = torch.empty(batch, width, device="meta")
    one = readiness.check(model, (x,), topology="v5e:2x2", find_largest_batch=True)
    assert not one.fits and one.margin_bytes < 0
    largest = one.largest_batch
    assert largest is not None and 1024 < largest < batch
    assert one.smallest_not_fitting == largest + 1  # exact: largest + 1 was compiled and found too big
    # Checked again from scratch: the largest fits, one more does not.
    assert readiness.check(model, (torch.empty(largest, width, device="meta"),), topology="v5e:2x2").fits
    assert not readiness.check(model, (torch.empty(largest + 1, width, device="meta"),),
                               topology="v5e:2x2").fits
    four = readiness.check(model, (x,), topology="v5e:2x2", chips=4)
    assert four.fits and four.chips == 4
    # Per chip: a quarter of the batch, so a quarter of the matmul flops.
    assert four.step_flops == pytest.approx(2 * batch * width * width * 3 / 4, rel=0.05)
    assert four.step_peak_bytes < one.memory_per_chip


def test_chips_split_flops_and_memory():
    x = torch.randn(4096, 32)
    model = models.MLP()
    one = readiness.check(model, (x,), topology="v5e:2x2")
    four = readiness.check(model, (x,), topology="v5e:2x2", chips=4)
    assert four.step_flops == pytest.approx(one.step_flops / 4, rel=0.1)
    assert four.step_peak_bytes < one.step_peak_bytes


# ---- the largest-batch search, on known curves (no compiles) --------------------------------

@pytest.mark.parametrize("curve,monotone", [
    (lambda b: 100 + 7 * b, True),                           # affine
    (lambda b: 1000 + int(3 * b ** 1.3), True),              # superlinear
    (lambda b: 1000 + 64 * (-(-b // 128)) * 128, True),      # steps (padding to tiles)
    (lambda b: 5000 + 50 * b + (b % 16) * 30, False),        # jagged
])
@pytest.mark.parametrize("step", [1, 4])
def test_search_largest(curve, monotone, step):
    memory = 10**6
    calls = []
    lo, hi = core.search_largest(lambda b: calls.append(b) or curve(b), step, 1 << 20, memory)
    first_too_big = step
    while curve(first_too_big) <= memory:
        first_too_big += step
    assert curve(lo) <= memory and hi == lo + step and curve(hi) > memory
    if monotone:
        assert lo == first_too_big - step
    else:
        assert abs(lo - (first_too_big - step)) <= 16 * step
    assert len(calls) <= 32


def test_search_largest_edges():
    assert core.search_largest(lambda b: 10 + b, 1, 1 << 10, 5) == (None, 1)
    assert core.search_largest(lambda b: b, 1, 1 << 10, 10**9) == (1 << 10, None)
    lo, hi = core.search_largest(lambda b: 100 + 7 * b, 1, 1 << 20, 10**6, tolerance=0.02)
    assert lo <= (10**6 - 100) // 7 < hi <= lo * 1.02 + 1


def test_out_of_memory_message_is_parsed():
    msg = ("torch_pjrt: compile for the topology failed in 'libtpu.so': Ran out of memory on HBM, the total "
           "memory required for HLO temporaries (15.75G) exceeds available HBM (15.75G).")
    assert core.out_of_memory_bytes(msg) == int(15.75 * GIB)
    assert core.out_of_memory_bytes("INVALID_ARGUMENT: bad shape") is None


# ---- start-up and a missing libtpu ----------------------------------------------------------

_START = ("import time, torch_pjrt.readiness as r; t = time.time(); "
          "print(r.plugin.topology('v5e:2x2').info()['devices'][0]['kind'], round(time.time() - t, 2))")


def test_startup_without_metadata_server_is_quick():
    # No TPU and no metadata server here: without TPU_SKIP_MDS_QUERY libtpu would wait for minutes.
    env = _env()
    env.pop("TPU_SKIP_MDS_QUERY", None)
    t = time.time()
    p = subprocess.run([sys.executable, "-c", _START], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "TPU v5 lite" in p.stdout
    assert time.time() - t < 60
    assert "could not determine TPU accelerator type" not in p.stderr


def test_startup_that_blocks_hits_the_deadline(tmp_path):
    # A plugin whose start-up never returns (as libtpu's does when it waits
    # on a metadata server that never answers): the deadline raises, naming
    # the plugin and what libtpu needs, and the process exits normally.
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the blocking plugin")
    src = tmp_path / "blocking.c"
    src.write_text("#include <unistd.h>\nconst void* GetPjrtApi(void) { for (;;) sleep(1000); return 0; }\n")
    so = tmp_path / "libblocking.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    env = _env(TORCH_PJRT_LIBTPU=str(so), TORCH_PJRT_LIBTPU_TIMEOUT="3")
    t = time.time()
    p = subprocess.run([sys.executable, "-c", _START], env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.time() - t
    assert p.returncode == 1
    assert "did not start within 3 s" in p.stderr and str(so) in p.stderr, p.stderr[-2000:]
    assert "TPU_SKIP_MDS_QUERY" in p.stderr
    assert elapsed < 30


def test_libtpu_absent_gives_clear_message(tmp_path):
    env = _env(TORCH_PJRT_LIBTPU=str(tmp_path / "no-libtpu.so"))
    code = ("import torch, torch_pjrt.readiness as r\n"
            "assert not r.available()\n"
            "try:\n"
            "    r.check(lambda x: x + 1, (torch.ones(4),))\n"
            "except r.LibtpuMissing as e:\n"
            "    print('MISSING:', e)\n")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "MISSING:" in p.stdout and "pip install libtpu==" in p.stdout
    cli = subprocess.run([sys.executable, "-m", "torch_pjrt", "readiness", "examples/workloads.py:cnn"],
                         env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert cli.returncode == 2
    assert "pip install libtpu==" in cli.stderr and "Traceback" not in cli.stderr


# ---- the command ----------------------------------------------------------------------------

def test_cli_table_and_json(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "torch_pjrt", "readiness", "examples/workloads.py:cnn",
                        "--topology", "v5e:2x2,v6e:2x2", "--batch", "2,8", "--chips", "1,2", "--json", str(out)],
                       env=_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "ESTIMATE" in p.stdout and "v6e:2x2" in p.stdout
    rows = json.loads(out.read_text())
    assert len(rows) == 2 * 2 * 2
    assert {(r["topology"], r["chips"], r["batch_size"]) for r in rows} == {
        (t, c, b) for t in ("v5e:2x2", "v6e:2x2") for c in (1, 2) for b in (2, 8)}
    assert all(r["fits"] and r["step_flops"] > 0 for r in rows)
    by = {(r["topology"], r["chips"], r["batch_size"]): r for r in rows}
    assert by[("v5e:2x2", 1, 8)]["step_flops"] > by[("v5e:2x2", 1, 2)]["step_flops"]
    assert by[("v5e:2x2", 2, 8)]["step_flops"] < by[("v5e:2x2", 1, 8)]["step_flops"]


def test_cli_bad_workload_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "torch_pjrt", "readiness", "examples/workloads.py:nope"],
                       env=_env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "nope" in p.stderr


def test_topologies_by_name_and_options():
    from torch_pjrt.readiness import plugin
    info = plugin.topology("v5e:2x2").info()
    assert len(info["devices"]) == 4 and info["devices"][0]["kind"] == "TPU v5 lite"
    assert int(info["attributes"]["device_memory_bytes_limit"]) == CHIP_MEMORY["v5e:2x2"]
    assert len(plugin.topology("v5e:1x1", chips_per_host_bounds=(1, 1, 1)).info()["devices"]) == 1
    assert len(plugin.topology("v5e:2x2", num_slices=2).info()["devices"]) == 8
    # v4 shows each of a chip's two TensorCores as a device: per-device peaks are half the chip's.
    r = readiness.check(lambda x: x * 2, (torch.ones(8),), topology="v4:2x2x1")
    assert r.devices_in_topology == 8 and r.devices_per_chip == 2
    assert r.peak_flops_per_device == pytest.approx(275e12 / 2)


def test_largest_batch_cell():
    from torch_pjrt.readiness.cli import _largest
    assert _largest({"chips": 1, "largest_batch": 100, "smallest_not_fitting": 101}) == "100"
    assert _largest({"chips": 4, "largest_batch": 100, "smallest_not_fitting": 104}) == "100"
    assert _largest({"chips": 1, "largest_batch": 100, "smallest_not_fitting": 105}) == "100 (<105)"
    assert _largest({"chips": 1, "largest_batch": 4096, "smallest_not_fitting": None,
                     "largest_batch_searched_up_to": 4096}) == ">= 4096"
    assert _largest({"chips": 1, "largest_batch": None, "smallest_not_fitting": 1}) == "none"
    assert _largest({"chips": 1}) == "-"


def test_op_without_lowering_is_named():
    class I0(nn.Module):
        def forward(self, x):
            return torch.i0(x.abs() + 1)
    with pytest.raises(RuntimeError, match="i0.*cannot be one TPU program|cannot be one TPU program.*i0"):
        readiness.check(I0(), (torch.randn(4, 8),))


def test_summary_reads_well():
    r = readiness.check(models.MLP(), (torch.randn(16, 32),), topology="v5e:2x2")
    s = r.summary()
    assert "fits" in s and "KiB" in s and "(estimate)" in s and "v5e:2x2" in s


def test_single_chip_topology_and_optimizer_forms():
    r = readiness.check(lambda x: x @ x, (torch.randn(64, 64),), topology="v5e:1x1")
    assert r.devices_in_topology == 1 and r.fits
    model = models.MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.8, 0.9))
    for form in (opt, torch.optim.Adam, lambda ps: torch.optim.Adam(ps, lr=1e-3)):
        r = readiness.check(model, (torch.randn(16, 32),), mode="training", optimizer=form)
        assert "optimizer step" in {p.phase for p in r.programs}


def test_workload_with_keyword_inputs():
    # A Hugging Face style batch: a dict of tensors, passed as keyword arguments.
    from torch_pjrt.assess import Workload
    from torch_pjrt.readiness import cli

    class KW(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 16)

        def forward(self, input_ids, attention_mask):
            return (self.emb(input_ids) * attention_mask[..., None]).sum(1)
    w = Workload(name="kw", model=KW, make_inputs=lambda b: {"input_ids": torch.randint(0, 50, (b, 6)),
                                                           "attention_mask": torch.ones(b, 6)},
                 batch_sizes=(2,))
    rows = cli.workload_rows(w, ["v5e:2x2"], [2, 8])
    assert all("error" not in r and r["fits"] for r in rows), rows


# ---- misuse: clear errors, before anything compiles -----------------------------------------

CNN = os.path.join(ROOT, "examples", "workloads.py") + ":cnn"


def _cli(capsys, *argv):
    """The command in this process: (exit status, stdout, stderr)."""
    from torch_pjrt.readiness import cli
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("where", ["missing_dir", "under_a_file", "a_dir"])
def test_cli_json_path_checked_before_compiling(capsys, tmp_path, where):
    # It was opened after every compile: a traceback, and the figures lost.
    (tmp_path / "file").write_text("")
    path = {"missing_dir": tmp_path / "nope" / "x.json", "under_a_file": tmp_path / "file" / "x.json",
            "a_dir": tmp_path}[where]
    rc, out, err = _cli(capsys, CNN, "--batch", "1", "--json", str(path))
    assert rc == 2 and out == "", out
    assert err.count("\n") == 1 and "--json" in err and str(path) in err, err


@pytest.mark.parametrize("argv,says", [
    (["--batch", "-3"], "argument --batch: must be >= 1, got -3"),
    (["--batch", "0"], "argument --batch: must be >= 1, got 0"),
    (["--batch", "4,x"], "argument --batch: expected comma-separated integers"),
    (["--chips", "0"], "argument --chips: must be >= 1, got 0"),
    (["--tolerance", "-1"], "argument --tolerance: must be >= 0"),
    (["--tolerance", "nan"], "argument --tolerance: must be >= 0"),
    (["--max-batch", "0"], "argument --max-batch: must be >= 1"),
])
def test_cli_rejects_bad_numbers(capsys, argv, says):
    rc, out, err = _cli(capsys, CNN, *argv)
    assert rc == 2 and out == "" and err.count("\n") == 1 and says in err, err


def test_cli_workload_with_syntax_error_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def workload(:\n    pass\n")
    rc, out, err = _cli(capsys, f"{bad}:workload")
    assert rc == 2 and err.count("\n") == 1, err
    assert "SyntaxError" in err and "bad.py, line 1" in err and "Traceback" not in err


def test_inputs_the_host_cannot_allocate_are_a_row_error():
    # The largest batch's inputs (4 EiB) fail to allocate: that row is an error, the others are figures.
    from torch_pjrt.assess import Workload
    from torch_pjrt.readiness import cli
    w = Workload(name="big", model=lambda: nn.Linear(8, 8),
                 make_inputs=lambda b: torch.randn(b, 8) if b < 1024 else torch.empty(b, 1 << 40),
                 batch_sizes=(2,))
    rows = cli.workload_rows(w, ["v5e:2x2"], [2, 1 << 20])
    assert "error" not in rows[0] and rows[0]["fits"], rows[0]
    assert rows[1]["batch_size"] == 1 << 20 and "allocate" in rows[1]["error"], rows[1]


def test_batch_that_does_not_split_over_the_chips_is_refused():
    # It was replicated (every chip the whole batch) while the row said 3 chips, data parallel.
    with pytest.raises(ValueError, match="batch 4 does not split over 3 chips"):
        readiness.check(lambda x: x + 1, (torch.ones(4, 8),), chips=3)
    from torch_pjrt.assess import Workload
    from torch_pjrt.readiness import cli
    w = Workload(name="mlp", model=models.MLP, make_inputs=lambda b: torch.randn(b, 32), batch_sizes=(4,))
    rows = {r["chips"]: r for r in cli.workload_rows(w, ["v5e:2x2"], [4], chips=[1, 2, 3])}
    assert rows[1]["fits"] and rows[2]["fits"] and rows[2]["chips"] == 2
    assert "does not split over 3 chips" in rows[3]["error"] and "fits" not in rows[3]


@pytest.mark.parametrize("kwargs,error,says", [
    ({"model_or_fn": None}, TypeError, "model_or_fn must be an nn.Module or a callable, got NoneType"),
    ({"topology": None}, TypeError, "topology must be a name such as 'v5e:2x2', got None"),
    ({"chips": "4"}, TypeError, "chips must be an int >= 1, got '4'"),
    ({"chips": 0}, ValueError, "chips must be >= 1, got 0"),
    ({"max_batch": 0}, ValueError, "max_batch must be >= 1, got 0"),
    ({"tolerance": -1}, ValueError, "tolerance must be >= 0"),
])
def test_check_argument_errors_name_the_argument(kwargs, error, says):
    args = dict(model_or_fn=lambda x: x + 1, example_inputs=(torch.ones(4),))
    args.update(kwargs)
    with pytest.raises(error, match=re.escape(says)):
        readiness.check(**args)


def test_summary_says_when_the_search_hit_its_limit():
    # "largest batch 64" read as exact; the table says ">= 64" (64 fits, nothing larger was tried).
    r = readiness.check(lambda x: x * 2, (torch.ones(4, 8),), find_largest_batch=True, max_batch=64)
    assert r.largest_batch == 64 and r.smallest_not_fitting is None
    assert r.summary().endswith("largest batch >= 64"), r.summary()
    import dataclasses
    assert dataclasses.replace(r, largest_batch=None, smallest_not_fitting=1).summary().endswith(
        "largest batch none")
    assert dataclasses.replace(r, largest_batch=100, smallest_not_fitting=150).summary().endswith(
        "largest batch 100 (<150)")
    assert "largest" not in dataclasses.replace(r, largest_batch=None, smallest_not_fitting=None).summary()
