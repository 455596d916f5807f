"""The in-memory executable cache is LRU-bounded (entries and bytes) for every
frontend: a process that sees ever new shapes keeps a flat footprint, and
evictions are counted. Fresh processes, so the bounds and RSS are their own."""
import pytest
import torch

import torch_pjrt
from conftest import run_json


RSS = r"""
def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
"""


def test_eager_shapes_keep_resident_memory_flat():
    # 1,000 distinct shapes, each a new program (x * 2 + 1: two ops per shape).
    out = run_json("import json, os, torch, torch_pjrt\n" + RSS + r"""
x = None
marks = {}
for n in range(1, 1001):
    x = torch.ones(n, 3).to("tpu")
    (x * 2 + 1).cpu()
    if n in (200, 1000):
        marks[n] = rss_mib()
m = torch_pjrt.metrics()
print("RESULT " + json.dumps({"rss": marks, "size": m["executable_cache_size"],
      "evictions": m["executable_cache_evictions"], "compiles": m["xla_compiles"]}))
""", TORCH_PJRT_EXECUTABLE_CACHE_ENTRIES=64, TORCH_PJRT_CACHE_DIR="")
    assert out["size"] <= 64
    assert out["compiles"] >= 2000
    assert out["evictions"] >= out["compiles"] - 64
    growth = out["rss"]["1000"] - out["rss"]["200"]
    # Unbounded, 800 more shapes cost ~130 MiB here (~1.3 MiB per shape).
    assert growth < 25, out


def test_byte_bound_and_runtime_setting():
    out = run_json("import json, os, torch, torch_pjrt\n" + r"""
torch_pjrt.set_executable_cache_bounds(max_entries=0, max_bytes=20 * 64 * 1024)
for n in range(1, 61):
    torch.ones(n).to("tpu").mul(3).cpu()
m = torch_pjrt.metrics()
print("RESULT " + json.dumps({"bounds": torch_pjrt.executable_cache_bounds(), "size": m["executable_cache_size"],
      "bytes": m["executable_cache_bytes"], "evictions": m["executable_cache_evictions"]}))
""", TORCH_PJRT_CACHE_DIR="")
    assert out["bounds"] == [0, 20 * 64 * 1024]
    assert out["bytes"] <= 20 * 64 * 1024 and out["size"] <= 20
    assert out["evictions"] > 0


def test_compiled_graphs_are_bounded_and_recompile_after_eviction():
    out = run_json("import json, os, torch, torch_pjrt\n" + RSS + r"""
import torch._dynamo
torch._dynamo.config.cache_size_limit = 64
f = torch.compile(lambda t: (t.sin() * 2).sum(0), backend="tpu")  # a dynamic graph after shape 2: one program per size
marks, results = {}, []
for n in range(1, 61):
    results.append(bool(torch.allclose(f(torch.ones(n, 4).to("tpu")).cpu(), (torch.ones(n, 4).sin() * 2).sum(0))))
    if n in (20, 60):
        marks[n] = rss_mib()
# The first shape again: evicted long ago, compiled again, still right.
again = bool(torch.allclose(f(torch.ones(1, 4).to("tpu")).cpu(), (torch.ones(1, 4).sin() * 2).sum(0)))
m = torch_pjrt.metrics()
print("RESULT " + json.dumps({"ok": all(results) and again, "size": m["executable_cache_size"],
      "evictions": m["executable_cache_evictions"], "rss": marks}))
""", TORCH_PJRT_EXECUTABLE_CACHE_ENTRIES=8, TORCH_PJRT_CACHE_DIR="")
    assert out["ok"]
    assert out["size"] <= 8 and out["evictions"] > 40


@pytest.mark.strict_eager  # (counts one program per op)
def test_bounds_are_in_metrics_and_default():
    entries, nbytes = torch_pjrt.executable_cache_bounds()
    assert entries > 0 and nbytes > 0
    m = torch_pjrt.metrics()
    assert m["executable_cache_size"] <= entries
    assert "executable_cache_evictions" in m and "executable_cache_bytes" in m
    # A hit keeps its program: the same op twice compiles once.
    x = torch.ones(7, 5).to("tpu")
    (x * 5.5).cpu()
    c = torch_pjrt.metrics()["xla_compiles"]
    (x * 5.5).cpu()
    assert torch_pjrt.metrics()["xla_compiles"] == c


def test_memory_mappings_are_bounded():
    """Every CPU-plugin executable maps its code in pieces (a program of 125
    slices and a concatenate, as max_pool3d's lowering once was: ~400
    mappings); at vm.max_map_count the plugin aborted (PyTorch's
    test_pooling.py ran into it). Past the mapping bound the oldest
    executables go; results stay right."""
    out = run_json("import json, torch, torch_pjrt\n" + r"""
import torch.nn.functional as F
def maps():
    return len(open("/proc/self/maps").read().splitlines())
def window_max(x):  # one fused program of 125 slices
    d, h, w = (s - 4 for s in x.shape[-3:])
    with torch_pjrt.fused():
        parts = [x[..., i:i + d, j:j + h, k:k + w].unsqueeze(-1) for i in range(5) for j in range(5) for k in range(5)]
        return torch.cat(parts, -1).amax(-1)
base = maps()
worst, ok = 0, True
for n in range(2, 8):
    x = torch.randn(1, 2, 6 + n, 6, 6)
    ok &= torch.equal(window_max(x.to("tpu")).cpu(), F.max_pool3d(x, 5, 1))
    worst = max(worst, maps())
m = torch_pjrt.metrics()
print("RESULT " + json.dumps({"base": base, "worst": worst, "ok": bool(ok),
      "evictions": m["executable_cache_mapping_evictions"]}))
""", TORCH_PJRT_EXECUTABLE_CACHE_MAPPINGS="800", TORCH_PJRT_CACHE_DIR="")
    assert out["ok"]
    assert out["evictions"] > 0, out
    assert out["worst"] < 800 + 600, out  # the bound, plus at most one executable over it


@pytest.mark.strict_eager  # (counts one program per op)
def test_a_hot_program_stays_and_dropped_entries_are_not_found_again():
    """Eager lookups of a key go through a per-thread front without the
    cache's lock; its hits still keep their program's place in the LRU order,
    and nothing dropped from the cache is found through it again."""
    out = run_json("import json, os, torch, torch_pjrt\n" + r"""
from torch_pjrt import _state
x = torch.arange(6.0).to("tpu")
ok = True
def hot():
    return bool(torch.allclose(x.sin().cpu(), torch.arange(6.0).sin()))
def new_program(n):
    return bool(torch.equal(torch.ones(n).to("tpu").mul(3).cpu(), torch.full((n,), 3.0)))
_state.C.record_programs(True)
ok &= hot() and hot()            # the oldest entry (found once: in the front) ...
for n in range(1, 40):
    ok &= new_program(n)
for _ in range(100):
    ok &= hot()                  # ... now the most recently used
for n in range(40, 70):
    ok &= new_program(n)         # past the bound of 64: the oldest ones go
ok &= hot()
_state.C.record_programs(False)
hot_compiles = sum("sine" in t for name, t in _state.C.take_recorded_programs())
torch_pjrt.clear_executable_cache()
c = torch_pjrt.metrics()["xla_compiles"]
ok &= hot()
print("RESULT " + json.dumps({"ok": ok, "hot_compiles": hot_compiles,
      "after_clear": torch_pjrt.metrics()["xla_compiles"] - c,
      "evictions": torch_pjrt.metrics()["executable_cache_evictions"]}))
""", TORCH_PJRT_EXECUTABLE_CACHE_ENTRIES=64, TORCH_PJRT_CACHE_DIR="")
    assert out["ok"]
    assert out["evictions"] > 0
    assert out["hot_compiles"] == 1, out     # not evicted as if unused
    assert out["after_clear"] == 1, out      # cleared: compiled again, not found in a front
