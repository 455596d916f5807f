"""The persistent executable cache (csrc/runtime/persistent_cache.*, torch_pjrt/cache.py).

Every test runs the same small workload in fresh processes against a cache
directory under tmp_path (the cache directory is read once per process)."""
import hashlib
import json
import os
import re
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
        for field in ("plugin=", "plugin_content=", "platform_version=", "pjrt_c_api=",
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


def test_the_directory_is_scanned_for_the_cap_once_not_at_every_write(warm, tmp_path):
    # Adding up a big cache costs a stat per entry (0.2 s at 100,000 entries):
    # scanned at the first write; later writes that keep the total under the
    # cap (this process's own count) do not scan again.
    _, m, err = run(TORCH_PJRT_CACHE_DIR=tmp_path / "cache")
    assert "torch_pjrt:" not in err, err
    assert m["persistent_cache_writes"] == warm[2]["xla_compiles"] > 2
    assert m["persistent_cache_scans"] == 1
    # A cap every write passes: each write scans (and evicts).
    _, m, err = run(TORCH_PJRT_CACHE_DIR=tmp_path / "small", TORCH_PJRT_CACHE_MAX_SIZE="1")
    assert m["persistent_cache_scans"] == m["persistent_cache_writes"] > 2


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


# ------------------------------------------------------------ SIZE syntax

@pytest.mark.parametrize("text, size", [
    ("0", 0), ("1", 1), ("4096", 4096), ("12b", 12), ("500M", 500 << 20), ("2G", 2 << 30),
    ("1.5GiB", 3 << 29), ("10GB", 10 ** 10), ("3 kb", 3000), (" 7K ", 7168), (".5k", 512),
    ("5.", 5), ("0.3KiB", 307), ("1T", 1 << 40), ("2tb", 2 * 10 ** 12), ("none", None),
    ("Unlimited", None), ("9223372036854775807", 2 ** 63 - 1)])
def test_size_parser(text, size):
    assert cache.parse_size(text) == size


@pytest.mark.parametrize("text", ["", ".", "-1", "1e3", "12Q", "5 m b", "1,5G", "8EiB",
                                  "9223372036854775808", "1.5\u212a", "\u0665"])
def test_size_parser_rejects(text):
    with pytest.raises(ValueError, match="not a size"):
        cache.parse_size(text)


def test_cap_setting(monkeypatch):
    monkeypatch.delenv(cache.MAX_SIZE_ENV, raising=False)
    assert cache.max_size() == cache.DEFAULT_MAX_SIZE == 10 << 30
    for text, cap in [("", 10 << 30), ("2G", 2 << 30), ("0", None), ("none", None)]:
        monkeypatch.setenv(cache.MAX_SIZE_ENV, text)
        assert cache.max_size() == cap
    monkeypatch.setenv(cache.MAX_SIZE_ENV, "lots")
    with pytest.raises(ValueError, match="^TORCH_PJRT_CACHE_MAX_SIZE: not a size: 'lots'"):
        cache.max_size()


# ------------------------------------------------------------------- prune

def test_prune_removes_least_recently_used_first(warm, tmp_path, capsys):
    d = copy_of(warm, tmp_path)
    now = time.time()
    files = sorted(d.iterdir())
    order = files[1::2] + files[::2]  # last use, oldest first: not the name order
    for i, p in enumerate(order):
        os.utime(p, (now - 5000 + i, now - 5000 + i))
    stale, fresh = d / ".ab.tmp.1.2", d / ".cd.tmp.3.4"  # interrupted writes, and a running one
    stale.write_bytes(b"partial")
    os.utime(stale, (now - 2 * 3600, now - 2 * 3600))
    fresh.write_bytes(b"partial")
    sizes = [p.stat().st_size for p in order]
    limit = sum(sizes) // 2
    assert cache.main(["prune", "--max-size", str(limit), "--dir", str(d)]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    k = sum(not p.exists() for p in order)
    assert [p.exists() for p in order] == [False] * k + [True] * (len(order) - k)
    left = sum(sizes[k:])
    assert left <= limit < left + sizes[k - 1]  # the oldest, and no more than needed
    lines = out.out.splitlines()
    assert [ln.split()[1] for ln in lines[:k]] == [p.name[:16] for p in order[:k]]
    assert lines[k:] == [
        f"removed stale temporary file {stale.name}",
        f"pruned {k} entries ({sum(sizes[:k])} bytes) and 1 temporary files; "
        f"left {len(order) - k} entries, {left} bytes ({left / 1024:.1f} KiB) in {d}"]
    assert not stale.exists() and fresh.exists()
    # the Python function: None prunes nothing, 0 everything (the cap setting's 0 is no cap)
    assert cache.prune(None, d) == ([], [], len(order) - k, left)
    r = cache.prune("0", d)
    assert [path for path, _, _ in r.removed] == [str(p) for p in order[k:]]
    assert (r.count, r.total) == (0, 0) and os.listdir(d) == [fresh.name]


def test_prune_default_is_the_cap_setting(warm, tmp_path, capsys, monkeypatch):
    d = copy_of(warm, tmp_path)
    monkeypatch.setenv(cache.MAX_SIZE_ENV, "1")
    assert cache.main(["prune", "--dir", str(d)]) == 0
    assert len(cache.entries(str(d))) == 0
    monkeypatch.setenv(cache.MAX_SIZE_ENV, "a lot")
    assert cache.main(["prune", "--dir", str(d)]) == 2
    assert capsys.readouterr().err == (
        "torch_pjrt.cache: TORCH_PJRT_CACHE_MAX_SIZE: not a size: 'a lot' (bytes or a number "
        "with a unit: 500M, 2G, 1.5GiB, 10GB; or none, unlimited); give --max-size\n")
    with pytest.raises(SystemExit) as e:
        cache.main(["prune", "--max-size", "a lot", "--dir", str(d)])
    assert e.value.code == 2
    assert "error: argument --max-size: not a size: 'a lot'" in capsys.readouterr().err


# ------------------------------------------------ CLI with hostile content

HEX_A, HEX_B = "a" * 64 + cache.SUFFIX, "b" * 64 + cache.SUFFIX
ODD_NAME = os.fsdecode(b"we\nird\xff" + cache.SUFFIX.encode())  # a newline, a byte not UTF-8


def _hostile(kind, base, warm):
    """Makes a cache of kind under base; returns (the --dir path, the hostile path)."""
    d = base / "cache"
    if kind == "not_a_directory":
        d.write_text("a file where the cache should be")
        return d, d
    if kind == "missing":
        return d, d
    shutil.copytree(warm[0], d)
    p = d / HEX_A
    if kind == "directory_entry":
        p.mkdir()
        (p / "inside").write_text("x")
    elif kind == "unreadable_entry":
        p = d / sorted(os.listdir(d))[0]
        p.chmod(0)
    elif kind == "fifo_entry":
        os.mkfifo(p)
    elif kind == "broken_symlink":
        p.symlink_to(base / "nothing")
    elif kind == "symlink_to_directory":
        (base / "elsewhere").mkdir()
        p.symlink_to(base / "elsewhere")
    elif kind == "odd_names":
        first = d / sorted(os.listdir(d))[0]
        p = d / "copy.pjrtexe"
        shutil.copy(first, p)  # fine content, a name the runtime never makes
        shutil.copy(first, d / ODD_NAME)
        (d / "notes.txt").write_text("not ours")
    elif kind in ("read_only_dir", "unlistable_dir", "unsearchable_dir"):
        d.chmod({"read_only_dir": 0o555, "unlistable_dir": 0o333, "unsearchable_dir": 0o666}[kind])
        p = d
    return d, p


NEEDS_PERMISSIONS = {"unreadable_entry", "read_only_dir", "unlistable_dir", "unsearchable_dir"}
def _expect(**commands):
    """command -> (exit status, what stderr says: a regex, or None: nothing);
    by default 0 and nothing."""
    return {c: commands.get(c, (0, None)) for c in ("list", "size", "clear", "prune")}


DENIED = r"cannot {verb} \d+ files in {{p}}: Permission denied \(first: "
HOSTILE = {  # kind -> command -> (exit status, stderr)
    "directory_entry": _expect(clear=(1, r"cannot remove {p}: a directory, not a cache entry")),
    "unreadable_entry": _expect(),
    "fifo_entry": _expect(),
    "broken_symlink": _expect(),
    "symlink_to_directory": _expect(),
    "odd_names": _expect(),
    "read_only_dir": _expect(clear=(1, DENIED.format(verb="remove")),
                             prune=(1, DENIED.format(verb="remove"))),
    "unsearchable_dir": _expect(size=(1, DENIED.format(verb="stat")),
                                clear=(1, DENIED.format(verb="remove")),
                                prune=(1, DENIED.format(verb="stat"))),
    "unlistable_dir": {c: (1, r"cannot list {p}: Permission denied") for c in _expect()},
    "not_a_directory": {c: (1, r"{p} is not a directory") for c in _expect()},
    "missing": {c: (1, r"no such directory: {p}") for c in _expect()},
}
DIRECTORY_FAILS = {"unlistable_dir", "not_a_directory", "missing"}
# kind -> names left by (clear, prune --max-size 1) when they succeed: not
# files of ours (directories, notes.txt), and for prune what takes no room
LEFT = {"directory_entry": ({HEX_A}, {HEX_A}), "unreadable_entry": (set(), set()),
        "fifo_entry": (set(), {HEX_A}), "broken_symlink": (set(), {HEX_A}),
        "symlink_to_directory": (set(), {HEX_A}), "odd_names": ({"notes.txt"}, {"notes.txt"})}
BAD = {"directory_entry": "not a regular file (a directory)",
       "unreadable_entry": "cannot read: Permission denied",
       "fifo_entry": "not a regular file (a FIFO)", "broken_symlink": "broken symbolic link",
       "symlink_to_directory": "symbolic link to a directory",
       "unsearchable_dir": "cannot stat: Permission denied",
       "odd_names": "not named <64 hex digits>.pjrtexe: the runtime never loads it"}
COMMANDS = {"list": ["list"], "size": ["size"], "clear": ["clear"],
            "prune": ["prune", "--max-size", "1"]}

# Runs cache.main() for each argv in a JSON file in one process, loading
# cache.py by its path (no torch, no plugin); prints each one's status and output.
CLI_DRIVER = r"""
import contextlib, importlib.util, io, json, sys, traceback
spec = importlib.util.spec_from_file_location("cache_cli", sys.argv[1])
cache = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cache)
done = []
for argv in json.load(open(sys.argv[2])):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cache.main(argv)
        except SystemExit as e:
            status = e.code
        except BaseException:
            traceback.print_exc()
            status = "Traceback"
    done.append({"status": status, "out": out.getvalue(), "err": err.getvalue()})
print(json.dumps(done))
"""


@pytest.fixture(scope="module")
def hostile_runs(warm, tmp_path_factory, unprivileged):
    """(kind, command) -> (result, dir, hostile path): every command on a fresh
    cache of every kind, in one process without permission overrides."""
    jobs, where = [], []
    for kind in HOSTILE:
        for command in COMMANDS:
            d, p = _hostile(kind, tmp_path_factory.mktemp(f"{kind}-{command}"), warm)
            jobs.append(COMMANDS[command] + ["--dir", str(d)])
            where.append(((kind, command), d, p))
    job_file = tmp_path_factory.mktemp("jobs") / "jobs.json"
    job_file.write_text(json.dumps(jobs))
    try:
        r = subprocess.run([*(unprivileged or [sys.executable]), "-c", CLI_DRIVER,
                            os.path.join(ROOT, "torch_pjrt", "cache.py"), str(job_file)],
                           capture_output=True, text=True, timeout=120)
    finally:
        for _, d, p in where:  # let the temporary directories be removed
            if os.path.isdir(d) and not os.path.islink(d):
                d.chmod(0o755)
            if os.path.isfile(p) and p != d:
                p.chmod(0o644)
    assert r.returncode == 0, r.stderr
    return {key: (result, d, p) for (key, d, p), result in zip(where, json.loads(r.stdout))}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("kind", list(HOSTILE))
def test_cli_handles_hostile_content(kind, command, hostile_runs, unprivileged, warm):
    if kind in NEEDS_PERMISSIONS and unprivileged is None:
        pytest.skip("root without CAP_SETPCAP: permission bits cannot be made to count")
    r, d, p = hostile_runs[kind, command]
    status, message = HOSTILE[kind][command]
    assert "Traceback" not in r["err"] + r["out"], r
    assert r["status"] == status, r
    if message is None:
        assert r["err"] == "", r
    else:
        assert re.fullmatch("torch_pjrt.cache: " + message.format(p=re.escape(str(p))) + r".*\n",
                            r["err"]), r
    n = warm[2]["xla_compiles"]
    lines = r["out"].splitlines()
    if kind in DIRECTORY_FAILS or (kind, command) == ("unsearchable_dir", "size"):
        assert r["out"] == "", r
    elif command == "list":  # every entry on one line, the odd ones BAD with the reason
        added = {"unreadable_entry": 0, "odd_names": 2}.get(kind, 0 if kind.endswith("_dir") else 1)
        assert len(lines) == n + added + 1, r
        shown = [ln for ln in lines if "  BAD: " in ln]
        count = {"unsearchable_dir": n, "odd_names": 2}.get(kind, 1 if kind in BAD else 0)
        assert len(shown) == count and all(ln.endswith("BAD: " + BAD[kind]) for ln in shown), r
        if kind == "odd_names":
            assert sorted(ln.split()[0] for ln in shown) == ["copy.pjrtexe", r"we\nird\xff.pjrtexe"]
    elif command in ("clear", "prune"):
        left = set(os.listdir(d))
        if status == 0:
            assert left == LEFT[kind][command == "prune"], r
        elif kind == "directory_entry":  # all but the directory
            assert left == {HEX_A}, r
        else:  # the directory could not be changed
            assert len(left) == n, r
    if kind == "symlink_to_directory":
        assert (d.parent / "elsewhere").is_dir()


def test_files_vanishing_during_a_command(warm, tmp_path, capsys, monkeypatch):
    """Files deleted by another process between the listing and the stat, and
    between the stat and the read or delete: as if they had never been there."""
    names_of, scan = cache._names, cache._scan

    def vanish(d, when):
        victims = sorted(n for n in os.listdir(d) if n.endswith(cache.SUFFIX))[:2]

        def names(directory):
            found = names_of(directory)
            if when == "listed":
                for n in victims:
                    os.unlink(os.path.join(directory, n))
            return found

        def scanned(directory):
            found = scan(directory)
            if when == "stat'ed":
                for n in victims:
                    os.unlink(os.path.join(directory, n))
            return found
        monkeypatch.setattr(cache, "_names", names)
        monkeypatch.setattr(cache, "_scan", scanned)
        return victims

    n = warm[2]["xla_compiles"]
    for when in ("listed", "stat'ed"):
        for command, expected in [("list", n - 2), ("size", n - 2 if when == "listed" else n),
                                  ("clear", n - 2), ("prune", n - 2)]:
            d = tmp_path / f"{command}-{when}"
            shutil.copytree(warm[0], d)
            vanish(d, when)
            assert cache.main(COMMANDS[command] + ["--dir", str(d)]) == 0, (command, when)
            out = capsys.readouterr()
            assert out.err == "", (command, when, out.err)
            last = out.out.splitlines()[-1]
            if command == "list":
                assert last.startswith(f"{expected} entries,") and "BAD" not in out.out
            elif command == "size":
                assert last.startswith(f"{expected} entries,")
            elif command == "clear":
                assert last == f"removed {expected} entries from {d}"
            else:
                assert last.startswith(f"pruned {expected} entries")
            if command in ("clear", "prune"):
                assert os.listdir(d) == []
            monkeypatch.undo()


def test_python_functions_on_hostile_content(warm, tmp_path):
    d, p = _hostile("directory_entry", tmp_path, warm)
    n = warm[2]["xla_compiles"]
    found = {e.path: e for e in cache.entries(d)}
    assert found[str(p)].status == "not a regular file (a directory)" and found[str(p)].size == 0
    assert cache.read_entry(p).status == "not a regular file (a directory)"
    assert cache.read_entry(tmp_path / "nothing").status.startswith("cannot stat: No such file")
    assert cache.total_size(d) == (n + 1, _entry_bytes(d))
    with pytest.raises(cache.CacheError, match="a directory, not a cache entry") as e:
        cache.clear(d)
    assert e.value.result == n and os.listdir(d) == [HEX_A]
    (tmp_path / "other").mkdir()
    f, _ = _hostile("not_a_directory", tmp_path / "other", warm)
    for call in (cache.entries, cache.total_size, cache.clear, lambda x: cache.prune(0, x)):
        with pytest.raises(cache.CacheError, match=f"^{re.escape(str(f))} is not a directory$"):
            call(f)


def test_cli_entry_point_without_traceback(warm, tmp_path, unprivileged):
    """python -m torch_pjrt.cache itself (the module run as a program)."""
    d, p = _hostile("directory_entry", tmp_path, warm)
    r = subprocess.run([sys.executable, "-m", "torch_pjrt.cache", "list", "--dir", str(d)],
                       env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert f"{'a' * 16}           0" in r.stdout
    assert "BAD: not a regular file (a directory)" in r.stdout
    d.chmod(0o555)
    try:
        r = subprocess.run([*(unprivileged or [sys.executable]), "-m", "torch_pjrt.cache",
                            "prune", "--max-size", "1k", "--dir", str(d)],
                           env=_env(), capture_output=True, text=True, timeout=60)
    finally:
        d.chmod(0o755)
    assert "Traceback" not in r.stderr
    if unprivileged:
        assert r.returncode == 1
        assert re.fullmatch(rf"torch_pjrt.cache: cannot remove \d+ files in {re.escape(str(d))}: "
                            r"Permission denied \(first: \w+\.pjrtexe\)\n", r.stderr), r.stderr


def _plugin_path():
    import torch_pjrt
    return torch_pjrt.plugin_info()["path"]


def test_same_plugin_at_another_path_reuses_the_cache(warm, tmp_path):
    # A new venv or clone installs the same plugin wheel at another path with
    # a new file time: the identity is the plugin's content, so its processes
    # load what earlier ones compiled. A plugin of other content (here the
    # same file with bytes appended, still loadable) is another build.
    d = copy_of(warm, tmp_path)
    same = tmp_path / "venv2" / os.path.basename(_plugin_path())
    same.parent.mkdir()
    shutil.copyfile(_plugin_path(), same)
    results, m, err = run(TORCH_PJRT_CACHE_DIR=d, TORCH_PJRT_PLUGIN=same)
    assert results == warm[1]
    assert m["xla_compiles"] == 0 and m["persistent_cache_hits"] == programs(warm), err
    with open(same, "ab") as f:
        f.write(b"\0" * 4096)
    results, m, err = run(TORCH_PJRT_CACHE_DIR=d, TORCH_PJRT_PLUGIN=same)
    assert results == warm[1]
    assert m["persistent_cache_hits"] == 0 and m["xla_compiles"] == warm[2]["xla_compiles"], err
