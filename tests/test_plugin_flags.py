"""The XLA flags torch_pjrt adds before the plugin loads
(csrc/runtime/plugin_flags.cpp): added only where the plugin defines them
(XLA aborts on an unknown flag), never over the user's own setting, and taken
out again for a second plugin that does not know them."""
import os
import subprocess
import sys

import pytest
import torch

import torch_pjrt
from torch_pjrt import _state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = torch_pjrt.plugin_info()["path"]
ON_CPU = torch_pjrt.plugin_info()["name"] == "cpu"

# Prints XLA_FLAGS as the process sees it after torch_pjrt started the plugin
# (os.environ is a copy taken at start-up; the C library's is the live one).
SHOW_FLAGS = """
import ctypes, sys, torch, torch_pjrt
(torch.ones(2, device="tpu") + 1).cpu()
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
v = libc.getenv(b"XLA_FLAGS")
print((v or b"").decode())
"""


def _flags_in_child(env_flags=None, code=SHOW_FLAGS):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("XLA_FLAGS", None)
    if env_flags is not None:
        env["XLA_FLAGS"] = env_flags
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_flags_added_for_the_plugin():
    flags = _flags_in_child().split()
    assert "--xla_allow_excess_precision=false" in flags
    if ON_CPU:
        assert "--xla_cpu_use_fusion_emitters=false" in flags
    else:
        assert not any("xla_cpu_use_fusion_emitters" in f for f in flags)


@pytest.mark.skipif(not ON_CPU, reason="the flag is added for XLA's CPU plugin only")
def test_user_setting_wins():
    flags = _flags_in_child("--xla_cpu_use_fusion_emitters=true").split()
    assert flags.count("--xla_cpu_use_fusion_emitters=true") == 1
    assert not any(f == "--xla_cpu_use_fusion_emitters=false" for f in flags)
    assert "--xla_allow_excess_precision=false" in flags


def test_plugin_defines_flag_matches_whole_names(tmp_path):
    C = _state.C
    assert C.plugin_defines_flag(PLUGIN, "xla_allow_excess_precision")
    assert not C.plugin_defines_flag(PLUGIN, "xla_no_such_flag_at_all")
    # A piece of a defined name is not a defined name: the tail (a name
    # character before it), the head (no NUL after it).
    assert not C.plugin_defines_flag(PLUGIN, "allow_excess_precision")
    assert not C.plugin_defines_flag(PLUGIN, "xla_allow_excess_precisio")
    # A file that is not ELF is searched whole; a missing one defines nothing.
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\x00abc\x00xla_some_flag\x00tail")
    assert C.plugin_defines_flag(str(blob), "xla_some_flag")
    assert not C.plugin_defines_flag(str(blob), "some_flag")
    assert not C.plugin_defines_flag(str(tmp_path / "missing.so"), "xla_some_flag")


@pytest.mark.skipif(not ON_CPU, reason="the flag is added for XLA's CPU plugin only")
def test_flags_unknown_to_a_second_plugin_are_dropped(tmp_path):
    other = tmp_path / "other_plugin.so"
    other.write_bytes(b"\x00xla_allow_excess_precision\x00")  # knows one of the two
    code = SHOW_FLAGS.replace('print(', f'torch_pjrt._state.C.drop_flags_unknown_to({str(other)!r})\n'
                                        'v = libc.getenv(b"XLA_FLAGS")\nprint(', 1)
    flags = _flags_in_child("--xla_dump_to=/dev/null", code).split()
    assert flags == ["--xla_dump_to=/dev/null", "--xla_allow_excess_precision=false"]


@pytest.mark.skipif(not ON_CPU, reason="the flag is added for XLA's CPU plugin only")
def test_results_as_close_to_float64_either_way():
    # The emitters round alike but for erf (and gelu through it), where the
    # LLVM IR emitter's is the closer one (equal to CPU's bits for 304 of 561
    # values against 190). Each op's error, relative to max(|exact|, 1),
    # must be no larger with the flag than without it.
    code = """
import json, torch, torch_pjrt
g = torch.Generator().manual_seed(0)
a, b = torch.randn(33, 17, generator=g) * 3, torch.randn(17, 9, generator=g)
F = torch.nn.functional
ops = {"tanh": torch.tanh, "exp": torch.exp, "log1p": lambda x: torch.log1p(x.abs()), "gelu": F.gelu,
       "softmax": lambda x: x.softmax(-1), "sum": lambda x: x.sum(0), "erf": torch.erf, "sigmoid": torch.sigmoid,
       "sin": torch.sin, "pow": lambda x: x.abs() ** 1.7, "layer_norm": lambda x: F.layer_norm(x, (17,)),
       "tanh_gelu": lambda x: F.gelu(x, approximate="tanh"), "matmul": lambda x: x @ b.to(x.device).to(x.dtype)}
err = {k: float(((f(a.to("tpu")).cpu().double() - f(a.double())).abs() / f(a.double()).abs().clamp(min=1)).max())
       for k, f in ops.items()}
print(json.dumps(err))
"""
    import json
    with_flag = json.loads(_flags_in_child(None, code))
    without = json.loads(_flags_in_child("--xla_cpu_use_fusion_emitters=true", code))
    for op, e in with_flag.items():
        assert e <= without[op] * (1 + 1e-9), (op, e, without[op])
    assert max(with_flag.values()) < 1e-5, with_flag
