"""The persistent executable cache (csrc/runtime/persistent_cache.*, torch_pjrt/cache.py).

Every test runs the same small workload in fresh processes against a cache
directory under tmp_path (the cache directory is read once per process)."""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import pytest

from torch_pjrt import cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Forward and backward of a tiny layer on tpu:0, a few ops on tpu:1. Prints
# the results and the counters. REPEAT=n runs it n times, dropping the
# in-memory executable cache in between (every program goes back to the
# runtime's compile). START_FILE: wait for that file to exist first (lines up
# concurrent processes after their slow start-up). EXTRA=1: then one program
# the others never build (a write after every other program was loaded).
WORKLOAD = r"""
import json, os, sys, time
if os.environ.get("FSIZE_LIMIT"):  # a disk that fills up: writes fail with EFBIG
    import resource, signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = int(os.environ["FSIZE_LIMIT"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
import torch, torch_pjrt
start = os.environ.get("START_FILE")
while start and not os.path.exists(start):
    time.sleep(0.005)
results = []
for i in range(int(os.environ.get("REPEAT", "1"))):
    torch_pjrt.clear_executable_cache()
    x = torch.linspace(-1, 1, 24).reshape(4, 6)
    w = torch.linspace(-2, 1, 18).reshape(6, 3)
    xt, wt = x.to("tpu"), w.to("tpu").requires_grad_()
    y = torch.tanh(xt @ wt).pow(2).mean()
    y.backward()
    z = (x.to("tpu:1") * 3 - 1).exp().sum(1)
    results.append([y.item(), wt.grad.cpu().tolist(), z.cpu().tolist()])
if os.environ.get("EXTRA"):
    torch.arange(7.0).to("tpu").neg().cpu()
m = torch_pjrt.metrics()
print("RESULT " + json.dumps({"results": results,
                              "metrics": {k: v for k, v in m.items() if not isinstance(v, dict)}}))
"""

CACHE_ENV = ("TORCH_PJRT_CACHE_DIR", "XDG_CACHE_HOME", "HOME")


def _env(**env):
    full = {k: v for k, v in os.environ.items() if k not in CACHE_ENV}
    full["HOME"] = os.environ.get("HOME", "/")
    full.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    full.update({k: str(v) for k, v in env.items() if v is not None})
    return full


def start(python=(sys.executable,), **env):
    return subprocess.Popen([*python, "-c", WORKLOAD], env=_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc):
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
    data = json.loads(line[len("RESULT "):])
    return data["results"], data["metrics"], err


def run(**env):
    """Runs the workload in a fresh process: (results, metrics, stderr)."""
    return finish(start(**env))


def keys(directory):
    return sorted(e.key for e in cache.entries(str(directory)))


def leftovers(directory):
    return [n for n in os.listdir(directory) if not n.endswith(cache.SUFFIX)]


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache filled by one cold process: (dir, results, metrics)."""
    d = tmp_path_factory.mktemp("warm") / "cache"
    results, m, err = run(TORCH_PJRT_CACHE_DIR=d)
    assert "torch_pjrt:" not in err, err
    return d, results, m


def programs(warm):
    """Programs the workload builds (a text built twice is a hit the second time)."""
    return warm[2]["xla_compiles"] + warm[2]["persistent_cache_hits"]


def copy_of(warm, tmp_path):
    d = tmp_path / "cache"
    shutil.copytree(warm[0], d)
    return d


def test_first_process_compiles_and_saves_every_program(warm):
    d, _, m = warm
    assert m["xla_compiles"] >= 6
    assert m["persistent_cache_misses"] == m["xla_compiles"]
    assert m["persistent_cache_writes"] == m["xla_compiles"]
    assert m["persistent_cache_errors"] == 0
    found = cache.entries(str(d))
    assert len(found) == m["xla_compiles"] and leftovers(d) == []
    for e in found:
        assert e.status == "ok", e
        assert e.platform.startswith("cpu") and "xla_cpu_pjrt" in e.plugin
        # the identity names the plugin build
        for field in ("plugin_path=", "plugin_file=", "platform_version=", "pjrt_c_api=",
                      "attribute.xla_version=", "devices="):
            assert "\n" + field in e.identity


def test_second_process_loads_instead_of_compiling(warm, tmp_path):
    d = copy_of(warm, tmp_path)
    results, m, err = run(TORCH_PJRT_CACHE_DIR=d)
    assert results == warm[1]  # bit-identical: the very same executables
    assert m["xla_compiles"] == 0 and m["compile_seconds"] == 0
    assert m["persistent_cache_hits"] == programs(warm)
    assert m["persistent_cache_misses"] == 0 and m["persistent_cache_writes"] == 0
    assert m["persistent_cache_errors"] == 0
    assert m["persistent_cache_load_seconds"] > 0
    assert "torch_pjrt:" not in err, err


def test_empty_dir_setting_disables_the_cache(warm, tmp_path):
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    home.mkdir()
    xdg.mkdir()
    results, m, err = run(TORCH_PJRT_CACHE_DIR="", HOME=home, XDG_CACHE_HOME=xdg)
    assert results == warm[1]
    assert m["xla_compiles"] == warm[2]["xla_compiles"]
    for k in ("hits", "misses", "writes", "errors"):
        assert m["persistent_cache_" + k] == 0
    assert list(home.iterdir()) == [] and list(xdg.iterdir()) == []
    assert "torch_pjrt:" not in err, err


def test_default_dir_is_under_the_user_cache_dir(warm, tmp_path, monkeypatch):
    xdg = tmp_path / "xdg"
    _, m, _ = run(XDG_CACHE_HOME=xdg)
    expected = xdg / "torch_pjrt" / "executables"
    assert m["persistent_cache_writes"] == warm[2]["xla_compiles"]
    assert keys(expected) == keys(warm[0])  # same programs, same plugin: same keys
    for name in CACHE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    assert cache.cache_dir() == str(expected)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache.cache_dir() == str(tmp_path / ".cache" / "torch_pjrt" / "executables")
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", "")
    assert cache.cache_dir() is None


def _rewrite(path, data):
    with open(path, "wb") as f:
        f.write(data)


def _undeserializable(data):
    """The same entry with a payload of random bytes, consistent checksum and
    lengths: only loading it into the plugin can tell."""
    identity_size = struct.unpack_from("<I", data, 12)[0]
    payload = os.urandom(3000)
    header = bytearray(data[:cache.HEADER_SIZE])
    struct.pack_into("<Q", header, 56, len(payload))
    header[64:96] = hashlib.sha256(payload).digest()
    return bytes(header) + data[cache.HEADER_SIZE:cache.HEADER_SIZE + identity_size] + payload


# kind -> (damage(entry bytes, another entry's bytes) -> new bytes, expected message)
DAMAGE = {
    "truncated": (lambda d, other: d[:len(d) // 2], "truncated ({half} of {full} bytes)"),
    "empty": (lambda d, other: b"", "truncated (0 of at least 96 bytes)"),
    "corrupted": (lambda d, other: d[:-40] + bytes([d[-40] ^ 0x10]) + d[-39:],
                  "corrupted payload (checksum mismatch)"),
    "foreign_copy": (lambda d, other: other, "foreign entry (stored key"),
    "foreign_plugin": (lambda d, other: d.replace(b"\nplatform=cpu\n", b"\nplatform=xpu\n"),
                       "foreign entry (written with platform=xpu, this process has platform=cpu)"),
    "garbage": (lambda d, other: b"GIF89a" + bytes(200), "not a torch_pjrt cache entry (bad magic)"),
    "other_version": (lambda d, other: d[:8] + struct.pack("<I", 99) + d[12:],
                      "format version 99, this build reads 1"),
    "undeserializable": (lambda d, other: _undeserializable(d), "does not load: "),
}


def test_bad_entries_are_reported_once_recompiled_and_rewritten(warm, tmp_path):
    d = copy_of(warm, tmp_path)
    names = sorted(os.listdir(d))
    assert len(names) > len(DAMAGE), "the workload needs more programs than damage kinds"
    intact = names[-1]
    expected = {}
    for name, (kind, (damage, message)) in zip(names, DAMAGE.items()):
        data = (d / name).read_bytes()
        _rewrite(d / name, damage(data, (d / intact).read_bytes()))
        expected[name] = message.format(half=len(data) // 2, full=len(data))
        # cache.py checks all but the plugin identity and loading
        if kind not in ("foreign_plugin", "undeserializable"):
            assert cache.read_entry(str(d / name)).status.startswith(expected[name])

    results, m, err = run(TORCH_PJRT_CACHE_DIR=d)
    assert results == warm[1]
    n = len(DAMAGE)
    assert m["persistent_cache_errors"] == n
    assert m["xla_compiles"] == n and m["persistent_cache_writes"] == n
    assert m["persistent_cache_hits"] == programs(warm) - n
    lines = err.splitlines()
    assert len([ln for ln in lines if "ignoring cache entry" in ln]) == n, err
    for name, message in expected.items():
        prefix = f"torch_pjrt: ignoring cache entry {d / name}: {message}"
        assert len([ln for ln in lines if ln.startswith(prefix)]) == 1, (prefix, err)
    # rewritten: every entry valid again, and the next process compiles nothing
    assert keys(d) == keys(warm[0]) and leftovers(d) == []
    assert all(e.status == "ok" for e in cache.entries(str(d)))
    results, m, err = run(TORCH_PJRT_CACHE_DIR=d)
    assert results == warm[1]
    assert m["xla_compiles"] == 0 and m["persistent_cache_errors"] == 0
    assert "torch_pjrt:" not in err, err


def test_full_disk_warns_once_and_keeps_compiling(warm, tmp_path):
    # Writes fail (file size limit: EFBIG, as a full disk gives ENOSPC) and a
    # truncated entry stays bad, so the process meets it twice.
    d = copy_of(warm, tmp_path)
    bad = sorted(os.listdir(d))[0]
    _rewrite(d / bad, (d / bad).read_bytes()[:500])
    results, m, err = run(TORCH_PJRT_CACHE_DIR=d, REPEAT=2, FSIZE_LIMIT=700)
    assert results == [warm[1][0]] * 2
    assert m["xla_compiles"] == 2 and m["persistent_cache_writes"] == 0
    assert m["persistent_cache_errors"] == 2  # counted each time, reported once
    assert m["persistent_cache_hits"] == 2 * (programs(warm) - 1)
    assert err.count(f"ignoring cache entry {d / bad}: truncated (500 of ") == 1, err
    assert err.count("cannot write to the persistent executable cache") == 1, err
    assert leftovers(d) == []  # the partial temporary file was removed
    assert (d / bad).stat().st_size == 500


def test_unusable_dir_warns_once_and_keeps_compiling(warm, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    d = tmp_path / "file" / "cache"
    results, m, err = run(TORCH_PJRT_CACHE_DIR=d)
    assert results == warm[1]
    assert m["xla_compiles"] == warm[2]["xla_compiles"] and m["persistent_cache_writes"] == 0
    assert err.count(f"cannot create the persistent executable cache {d}: Not a directory") == 1, err


def test_concurrent_processes_share_one_cache(warm, tmp_path):
    d, go = tmp_path / "cache", tmp_path / "go"
    procs = [start(TORCH_PJRT_CACHE_DIR=d, START_FILE=go) for _ in range(4)]
    time.sleep(0.5)
    go.touch()
    for p in procs:
        results, m, err = finish(p)
        assert results == warm[1]
        assert m["xla_compiles"] + m["persistent_cache_hits"] == programs(warm)
        assert "torch_pjrt:" not in err, err
    assert keys(d) == keys(warm[0]) and leftovers(d) == []
    for e in cache.entries(str(d)):
        assert e.status == "ok", e


def test_cli_and_python_functions(warm, tmp_path, capsys):
    d = copy_of(warm, tmp_path)
    n = warm[2]["xla_compiles"]
    count, size = cache.total_size(str(d))
    assert count == n and size == sum(f.stat().st_size for f in d.iterdir())
    (d / ".leftover.tmp.1.2").write_bytes(b"partial")  # an interrupted write

    r = subprocess.run([sys.executable, "-m", "torch_pjrt.cache", "list", "--dir", str(d)],
                       env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == n + 1
    for e, line in zip(cache.entries(str(d)), lines):
        assert line.startswith(e.key[:16]) and str(e.size) in line and "cpu" in line
        assert "BAD" not in line
    assert lines[-1] == f"{n} entries, {size} bytes ({size / 1024:.1f} KiB) in {d}"

    assert cache.main(["size", "--dir", str(d)]) == 0
    assert capsys.readouterr().out.startswith(f"{n} entries, {size} bytes")
    assert cache.main(["clear", "--dir", str(d)]) == 0
    assert capsys.readouterr().out == f"removed {n} entries from {d}\n"
    assert os.listdir(d) == [] and cache.total_size(str(d)) == (0, 0)
    assert cache.clear(str(tmp_path / "missing")) == 0 and cache.entries(str(tmp_path / "missing")) == []


# ---------------------------------------------------------------- size cap

# Run as root, permission bits do not stop a process; this prefix runs Python
# without the capabilities that bypass them (dropped from the bounding set,
# so they are gone after exec). Not root: plain Python.
DROP_CAPABILITIES = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for cap in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
    if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        sys.exit(77)
os.execv(sys.executable, [sys.executable] + sys.argv[1:])
"""


@pytest.fixture(scope="module")
def unprivileged(tmp_path_factory):
    """The command prefix that runs Python subject to permission bits, or None
    when this machine cannot (root without CAP_SETPCAP)."""
    if os.geteuid() != 0:
        return [sys.executable]
    python = [sys.executable, "-c", DROP_CAPABILITIES]
    locked = tmp_path_factory.mktemp("perm") / "locked"
    locked.write_text("x")
    locked.chmod(0)
    r = subprocess.run([*python, "-c", f"open({str(locked)!r})"], capture_output=True, text=True)
    return python if "PermissionError" in r.stderr else None


def _fillers(d, sizes, first_mtime):
    """Entries named like real ones that the workload never loads, the first
    the least recently used."""
    paths = []
    for i, size in enumerate(sizes):
        p = d / (hashlib.sha256(b"filler %d" % i).hexdigest() + cache.SUFFIX)
        p.write_bytes(bytes(size))
        os.utime(p, (first_mtime + i, first_mtime + i))
        paths.append(p)
    return paths


def _entry_bytes(d):
    return sum(e.size for e in cache.entries(str(d)))


def test_size_cap_evicts_least_recently_used_and_hits_count_as_use(warm, tmp_path):
    d = copy_of(warm, tmp_path)
    now = time.time()
    used = sorted(d.iterdir())
    for p in used:  # the oldest of all: only the hits of the run can save them
        os.utime(p, (now - 20000, now - 20000))
    fillers = _fillers(d, [20000] * 6, now - 10000)
    cap = _entry_bytes(d) - 6 * 20000 + 3 * 20000 + 10000
    began = time.time()
    # "<cap / 1000>KB": the C++ parser's decimal unit and fraction
    results, m, err = run(TORCH_PJRT_CACHE_DIR=d, EXTRA=1,
                          TORCH_PJRT_CACHE_MAX_SIZE=f"{cap // 1000}.{cap % 1000:03d}KB")
    assert results == warm[1] and "torch_pjrt:" not in err, err
    assert m["persistent_cache_hits"] == programs(warm) and m["xla_compiles"] >= 1
    left = {e.key: e for e in cache.entries(str(d))}
    assert _entry_bytes(d) <= cap
    for p in used:  # kept, and each hit made it recent
        assert left[p.name[:-len(cache.SUFFIX)]].status == "ok", left
        assert p.stat().st_mtime >= began - 1
    written = set(left) - {p.name[:-len(cache.SUFFIX)] for p in used + fillers}
    assert len(written) == m["xla_compiles"]  # the new programs are kept
    assert all(left[k].status == "ok" for k in written)
    gone = [not p.exists() for p in fillers]
    k = sum(gone)
    assert gone == [True] * k + [False] * (6 - k) and 0 < k < 6  # the oldest first
    assert _entry_bytes(d) + 20000 > cap  # and no more than needed
    if "persistent_cache_evictions" in m:
        assert m["persistent_cache_evictions"] == k


def test_cap_below_one_entry_keeps_only_the_one_just_written(warm, tmp_path):
    d = tmp_path / "cache"
    results, m, err = run(TORCH_PJRT_CACHE_DIR=d, TORCH_PJRT_CACHE_MAX_SIZE="1")
    assert results == warm[1] and "torch_pjrt:" not in err, err
    n = warm[2]["xla_compiles"]
    assert m["xla_compiles"] == n and m["persistent_cache_writes"] == n
    found = cache.entries(str(d))
    assert len(found) == 1 and found[0].status == "ok" and leftovers(d) == []
    assert found[0].key in keys(warm[0])
    if "persistent_cache_evictions" in m:
        assert m["persistent_cache_evictions"] == n - 1


def test_hostile_entries_and_a_bad_cap_setting_are_misses_with_a_warning(warm, tmp_path,
                                                                         unprivileged):
    d = copy_of(warm, tmp_path)
    names = sorted(os.listdir(d))
    as_dir, fifo, link_to_dir, broken_link, unreadable = (d / n for n in names[:5])
    for p in (as_dir, fifo, link_to_dir, broken_link):
        p.unlink()
    as_dir.mkdir()
    (as_dir / "inside").write_text("x")
    os.mkfifo(fifo)  # opening it for reading would block
    link_to_dir.symlink_to(tmp_path)
    broken_link.symlink_to(tmp_path / "nothing")
    unreadable.chmod(0)
    python = unprivileged or [sys.executable]
    results, m, err = run(python=python, TORCH_PJRT_CACHE_DIR=d,
                          TORCH_PJRT_CACHE_MAX_SIZE="12 parsecs")
    assert results == warm[1]
    expected = {as_dir: "not a regular file (a directory)", fifo: "not a regular file (a FIFO)",
                link_to_dir: "not a regular file (a directory)"}
    if unprivileged:
        expected[unreadable] = "cannot read: Permission denied"
    lines = err.splitlines()
    for path, what in expected.items():
        line = f"torch_pjrt: ignoring cache entry {path}: {what}; recompiling"
        assert lines.count(line) == 1, err
    assert lines.count(f"torch_pjrt: cannot save cache entry {as_dir}: Is a directory; "
                       "this program is not saved") == 1, err
    assert len([ln for ln in lines if "TORCH_PJRT_CACHE_MAX_SIZE='12 parsecs' is not a size"
                in ln and "using the default cap of 10 GiB" in ln]) == 1, err
    assert len(lines) == len(expected) + 2, err  # writing goes on for the others
    misses = 4 + bool(unprivileged)
    assert m["xla_compiles"] == misses and m["persistent_cache_errors"] == len(expected)
    assert m["persistent_cache_writes"] == misses - 1
    # all but the directory hold the program again; nothing is evicted (cap: default)
    assert as_dir.is_dir() and (as_dir / "inside").exists()
    for p in (fifo, link_to_dir, broken_link, unreadable):
        assert cache.read_entry(str(p)).status == "ok" and not p.is_symlink()
    assert len(os.listdir(d)) == len(names) and leftovers(d) == []
