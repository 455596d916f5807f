"""The persistent executable cache: where it is, what is in it, emptying it.

Every program the backend compiles is saved there (serialized by the PJRT
plugin) and loaded instead of compiled by later processes. The C++ runtime
(csrc/runtime/persistent_cache.{h,cpp}) reads and writes the entries; this
module only looks at the directory and uses nothing but the standard library.

    python -m torch_pjrt.cache list|size|clear [--dir DIR]
    python -m torch_pjrt.cache prune [--max-size SIZE] [--dir DIR]

Directory: $TORCH_PJRT_CACHE_DIR; set but empty disables the cache. Unset:
$XDG_CACHE_HOME/torch_pjrt/executables (absolute XDG_CACHE_HOME only), else
~/.cache/torch_pjrt/executables.

An entry is anything named `*.pjrtexe` (not hidden); the bytes of those that
are regular files are the cache's size. An entry's mtime is its last use: the
runtime sets it when it writes or loads the entry. The runtime keeps the size
under TORCH_PJRT_CACHE_MAX_SIZE (default 10 GiB; 0, none or unlimited: no cap)
by deleting the least recently used entries after each write; `prune` does
the same on demand. SIZE is bytes or a number with a unit: K/KiB, M/MiB,
G/GiB, T/TiB are powers of 1024, KB, MB, GB, TB powers of 1000 (as in
coreutils; case-insensitive): 500M, 2G, 1.5GiB, 10GB. For prune, 0 removes
every entry and none/unlimited only stale temporary files; prune's default is
the cap.

`-m` imports the torch_pjrt package first, which loads the PJRT plugin;
`python .../torch_pjrt/cache.py ...` runs the same without it.

Commands: list (every entry, last use, platform; what is wrong with a bad
one: BAD and the reason), size, clear (every entry and temporary file; other
files are left alone, and so is a directory named like an entry, which makes
clear exit 1), prune (least recently used entries
until the size is at most SIZE, and temporary files of writes interrupted an
hour or more ago).

Exit status: 0 the command did its job (list exits 0 when it shows BAD
entries: showing them is its job); 1 it could not do all of it: the --dir
directory does not exist, the path is not a directory or cannot be listed,
size could not stat an entry, clear or prune could not delete something
(prune then also misses SIZE); 2 bad usage: arguments, SIZE, or a bad
TORCH_PJRT_CACHE_MAX_SIZE where prune needs it. Each problem is one line on
stderr starting with "torch_pjrt.cache: ". The Python functions raise
CacheError (one-line message) where the command exits 1.
"""
import argparse
import collections
import datetime
import hashlib
import os
import pwd
import re
import stat
import struct
import sys
import time

MAGIC = b"TPJRTEXE"
FORMAT_VERSION = 1
HEADER_SIZE = 96
SUFFIX = ".pjrtexe"
DEFAULT_MAX_SIZE = 10 << 30      # PersistentCache::kDefaultMaxSize
STALE_TEMP_SECONDS = 3600        # PersistentCache::kStaleTempSeconds
MAX_SIZE_ENV = "TORCH_PJRT_CACHE_MAX_SIZE"

__all__ = ["cache_dir", "entries", "total_size", "clear", "prune", "read_entry", "parse_size",
           "max_size", "Entry", "Pruned", "CacheError", "main"]

Entry = collections.namedtuple(
    "Entry", "path key size mtime status platform plugin program_bytes payload_bytes identity")
Entry.__doc__ = """One cache entry. status is "ok" or what is wrong with it (the
checks the runtime makes, except comparing the identity with the loaded plugin).
size: bytes of a regular file, else 0 (it takes no room in the cache); mtime:
its last use (None when it cannot be stat'ed)."""

Pruned = collections.namedtuple("Pruned", "removed temp_files count total")
Pruned.__doc__ = """What prune() did: removed, the (path, size, mtime) of each
entry it deleted, oldest first; temp_files, the paths of stale temporary files
it deleted; count and total: the entries and bytes left."""


class CacheError(Exception):
    """The directory, or some files in it, could not be handled; the message
    is one line. `result` holds what was done anyway (clear: the number of
    entries removed; prune: a Pruned), or None."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


# ---------------------------------------------------------------- settings

_UNITS = {"": 1, "b": 1}
for _i, _letter in enumerate("kmgt", 1):
    _UNITS.update({_letter: 1024 ** _i, _letter + "ib": 1024 ** _i, _letter + "b": 1000 ** _i})
_SIZE = re.compile(r"([0-9]*)(?:\.([0-9]*))?[ \t]*([a-z]*)")
_SIZE_HELP = "bytes or a number with a unit: 500M, 2G, 1.5GiB, 10GB; or none, unlimited"


def parse_size(text):
    """Bytes for SIZE text (see the module docstring); None for "none" and
    "unlimited". ValueError on anything else. The same rule, to the byte, as
    runtime::parse_byte_size in C++ (csrc/runtime/byte_size.cpp) (exact integers, 18 fraction digits)."""
    s = text.strip(" \t").lower()
    if s in ("none", "unlimited"):
        return None
    m = _SIZE.fullmatch(s) if text.isascii() else None  # C++ reads ASCII only
    if not m or not (m.group(1) or m.group(2)):
        raise ValueError(f"not a size: {text!r} ({_SIZE_HELP})")
    if m.group(3) not in _UNITS:
        raise ValueError(f"not a size: {text!r} (unknown unit {m.group(3)!r}; {_SIZE_HELP})")
    multiplier = _UNITS[m.group(3)]
    fraction = (m.group(2) or "")[:18]
    size = int(m.group(1) or 0) * multiplier
    if fraction:
        size += int(fraction) * multiplier // 10 ** len(fraction)
    if size >= 2 ** 63:
        raise ValueError(f"not a size: {text!r} (too large)")
    return size


def max_size():
    """The runtime's cap in bytes from TORCH_PJRT_CACHE_MAX_SIZE (unset or
    empty: DEFAULT_MAX_SIZE), or None for no cap. ValueError naming the
    variable on a bad value (the runtime then warns and uses the default)."""
    text = os.environ.get(MAX_SIZE_ENV, "")
    if not text:
        return DEFAULT_MAX_SIZE
    try:
        return parse_size(text) or None
    except ValueError as e:
        raise ValueError(f"{MAX_SIZE_ENV}: {e}") from None


def cache_dir():
    """The directory this process's runtime uses (the same rule as the C++
    side, PersistentCache::configured_dir), or None when the cache is disabled."""
    env = os.environ.get("TORCH_PJRT_CACHE_DIR")
    if env is not None:
        return env.rstrip("/") or ("/" if env.startswith("/") else None)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg.startswith("/"):
        return os.path.join(xdg, "torch_pjrt", "executables")
    home = os.environ.get("HOME") or ""
    if not home:
        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            return None
    return os.path.join(home, ".cache", "torch_pjrt", "executables") if home else None


def _dir(directory):
    return cache_dir() if directory is None else os.fspath(directory)


# ------------------------------------------------------------ reading files

def _shown(path):
    """A path as one printable line: undecodable bytes as \\xNN, control
    characters as Python escapes."""
    def shown(ch):
        if 0xdc80 <= ord(ch) <= 0xdcff:  # a byte os.fsdecode could not decode
            return f"\\x{ord(ch) - 0xdc00:02x}"
        return ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
    return "".join(shown(ch) for ch in os.fsdecode(path))


def _why(error):
    return error.strerror or str(error)


def _is_entry_name(name):
    return name.endswith(SUFFIX) and not name.startswith(".")


def _is_temp_name(name):  # PersistentCache::store's ".<hex>.tmp.<pid>.<random>"
    return name.startswith(".") and ".tmp." in name


_HEX_KEY = re.compile(r"[0-9a-f]{64}")


def _identity_field(identity, name):
    for line in identity.splitlines():
        if line.startswith(name + "="):
            return line[len(name) + 1:]
    return ""


def _kind(mode):
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _read_regular(path):
    """The bytes of a regular file, or a str saying why not. FileNotFoundError
    propagates (the file vanished)."""
    try:
        # O_NONBLOCK: a FIFO put there meanwhile must not block the open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        return f"cannot read: {_why(e)}"
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            return f"not a regular file ({_kind(mode)})"
        try:
            return f.read()
        except OSError as e:
            return f"cannot read: {_why(e)}"


def _parse(data, key):
    """(status, fields) of an entry file's bytes."""
    fields = {}
    if data[:8] != MAGIC[:min(len(data), 8)]:
        return "not a torch_pjrt cache entry (bad magic)", fields
    if len(data) < HEADER_SIZE:
        return f"truncated ({len(data)} of at least {HEADER_SIZE} bytes)", fields
    version, identity_size = struct.unpack_from("<II", data, 8)
    if version != FORMAT_VERSION:
        return f"format version {version}, this build reads {FORMAT_VERSION}", fields
    stored_key = data[16:48]
    program_bytes, payload_bytes = struct.unpack_from("<QQ", data, 48)
    checksum = data[64:96]
    identity = data[HEADER_SIZE:HEADER_SIZE + identity_size].decode("utf-8", "replace")
    xla = _identity_field(identity, "attribute.xla_version")
    fields.update(program_bytes=program_bytes, payload_bytes=payload_bytes, identity=identity,
                  platform=" ".join(x for x in (_identity_field(identity, "platform"),
                                                xla and "xla_version=" + xla) if x),
                  plugin=(_identity_field(identity, "plugin")  # older entries named the path
                          or _identity_field(identity, "plugin_path")))
    expected = HEADER_SIZE + identity_size + payload_bytes
    if len(data) < expected:
        return f"truncated ({len(data)} of {expected} bytes)", fields
    if len(data) > expected:
        return f"size mismatch ({len(data)} bytes, header says {expected})", fields
    if stored_key.hex() != key:
        return (f"foreign entry (stored key {stored_key.hex()[:16]}... "
                "does not match the file name)"), fields
    if hashlib.sha256(data[HEADER_SIZE + identity_size:]).digest() != checksum:
        return "corrupted payload (checksum mismatch)", fields
    return "ok", fields


def _content_status(path, key):
    """(status, fields) of what the runtime would read at path (following a
    symlink, as it does). FileNotFoundError when it vanished."""
    data = _read_regular(path)
    if isinstance(data, str):
        return data, {}
    return _parse(data, key)


def _link_status(path, key):
    try:
        target = os.stat(path)
    except FileNotFoundError:
        return "broken symbolic link", {}
    except OSError as e:
        return f"symbolic link that cannot be followed: {_why(e)}", {}
    if not stat.S_ISREG(target.st_mode):
        return f"symbolic link to {_kind(target.st_mode)}", {}
    return _content_status(path, key)


def _entry(path, st, error=None):
    """The Entry for a path and its lstat result (or the error of lstat)."""
    name = os.path.basename(path)
    key = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else name
    fields = dict(path=path, key=key, size=0, mtime=None, platform="", plugin="",
                  program_bytes=None, payload_bytes=None, identity="")
    if st is None:
        return Entry(status=f"cannot stat: {error}", **fields)
    fields["mtime"] = st.st_mtime
    if stat.S_ISLNK(st.st_mode):
        status, more = _link_status(path, key)
    elif not stat.S_ISREG(st.st_mode):
        status, more = f"not a regular file ({_kind(st.st_mode)})", {}
    else:
        fields["size"] = st.st_size
        status, more = _content_status(path, key)
    fields.update(more)
    if not _HEX_KEY.fullmatch(key):  # whatever it holds, it is not ours
        status = f"not named <64 hex digits>{SUFFIX}: the runtime never loads it"
    return Entry(status=status, **fields)


def read_entry(path):
    """Parses and checks one entry (the whole file is read). Problems with the
    file (missing, unreadable, a directory, ...) are its status."""
    path = os.fspath(path)
    try:
        return _entry(path, os.lstat(path))
    except OSError as e:
        return _entry(path, None, _why(e))


# ---------------------------------------------------------- the directory

_Item = collections.namedtuple("_Item", "name path st error")  # st: lstat, or None and error


def _names(directory):
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise CacheError(f"{_shown(directory)} is not a directory") from None
    except OSError as e:
        raise CacheError(f"cannot list {_shown(directory)}: {_why(e)}") from None


def _scan(directory):
    """The entries and temporary files in the directory, by name, with their
    lstat. Names that vanish meanwhile are left out; a missing directory is
    empty."""
    items = []
    for name in _names(directory):
        if not (_is_entry_name(name) or _is_temp_name(name)):
            continue
        path = os.path.join(directory, name)
        try:
            items.append(_Item(name, path, os.lstat(path), None))
        except FileNotFoundError:
            pass
        except OSError as e:
            items.append(_Item(name, path, None, _why(e)))
    return items


def _room(item):
    """Bytes an item takes in the cache: regular files only."""
    return item.st.st_size if item.st and stat.S_ISREG(item.st.st_mode) else 0


def entries(directory=None):
    """The entries in the cache directory (default: cache_dir()), sorted by
    name; bad ones carry what is wrong in their status. CacheError when the
    directory cannot be listed; a missing directory has none."""
    directory = _dir(directory)
    out = []
    for item in _scan(directory) if directory is not None else []:
        if _is_entry_name(item.name):
            try:
                out.append(_entry(item.path, item.st, item.error))
            except FileNotFoundError:  # removed meanwhile
                pass
    return out


def total_size(directory=None):
    """(number of entries, bytes of those that are regular files). CacheError
    when the directory cannot be listed or an entry cannot be stat'ed."""
    directory = _dir(directory)
    found = [i for i in (_scan(directory) if directory is not None else [])
             if _is_entry_name(i.name)]
    _raise_failures([("stat", i.path, i.error) for i in found if i.error])
    return len(found), sum(_room(i) for i in found)


def _remove(item, failures):
    """Unlinks an item (never a directory): True when done, None when it was
    gone already (another process removed it), False when it failed (the
    reason goes to failures)."""
    if item.st is not None and stat.S_ISDIR(item.st.st_mode):
        failures.append(("remove", item.path, "a directory, not a cache entry (left alone)"))
        return False
    try:
        os.unlink(item.path)
        return True
    except FileNotFoundError:
        return None
    except OSError as e:
        failures.append(("remove", item.path, _why(e)))
        return False


def _failure_lines(failures):
    """(verb, path, reason) failures, one line per verb and reason: the path
    when it is alone, else the count."""
    grouped = collections.OrderedDict()
    for verb, path, reason in failures:
        grouped.setdefault((verb, reason), []).append(path)
    for (verb, reason), paths in grouped.items():
        if len(paths) == 1:
            yield f"cannot {verb} {_shown(paths[0])}: {reason}"
        else:
            yield (f"cannot {verb} {len(paths)} files in {_shown(os.path.dirname(paths[0]))}: "
                   f"{reason} (first: {_shown(os.path.basename(paths[0]))})")


def _raise_failures(failures, result=None):
    if failures:
        raise CacheError("; ".join(_failure_lines(failures)), result)


def _clear(directory):
    """(entries removed, failures)."""
    removed, failures = 0, []
    for item in _scan(directory) if directory is not None else []:
        if _remove(item, failures):
            removed += _is_entry_name(item.name)
    return removed, failures


def clear(directory=None):
    """Deletes every entry (and temporary files of writes, even running ones);
    returns the number of entries deleted. Directories and other files are
    left alone. CacheError when something could not be deleted (after
    deleting the rest)."""
    removed, failures = _clear(_dir(directory))
    _raise_failures(failures, result=removed)
    return removed


def _stale(item, now):
    return (_is_temp_name(item.name) and item.st is not None and stat.S_ISREG(item.st.st_mode)
            and item.st.st_mtime < now - STALE_TEMP_SECONDS)


def _prune(directory, limit):
    """(Pruned, failures): limit in bytes, or None for no limit."""
    items = _scan(directory) if directory is not None else []
    now = time.time()
    failures = []
    temps = [i.path for i in items if _stale(i, now) and _remove(i, failures)]
    found = [i for i in items if _is_entry_name(i.name)]
    failures += [("stat", i.path, i.error) for i in found if i.error]
    count, total = len(found), sum(_room(i) for i in found)
    removed = []
    # Least recently used first; only regular files take room.
    files = sorted((i for i in found if i.st and stat.S_ISREG(i.st.st_mode)),
                   key=lambda i: (i.st.st_mtime_ns, i.name))
    for item in files:
        if limit is None or total <= limit:
            break
        outcome = _remove(item, failures)
        if outcome is not False:
            count, total = count - 1, total - item.st.st_size
        if outcome:
            removed.append((item.path, item.st.st_size, item.st.st_mtime))
    return Pruned(removed, temps, count, total), failures


def _limit(max_size):
    return parse_size(max_size) if isinstance(max_size, str) else max_size


def prune(max_size, directory=None):
    """Deletes least recently used entries until the entries' bytes are at
    most max_size (bytes, or SIZE text; None: no limit), and temporary files
    of writes interrupted STALE_TEMP_SECONDS or more ago; returns a Pruned.
    CacheError when something could not be deleted (after doing the rest)."""
    result, failures = _prune(_dir(directory), _limit(max_size))
    _raise_failures(failures, result=result)
    return result


# -------------------------------------------------------------- the command

def _human(n):
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def _when(mtime):
    try:
        return datetime.datetime.fromtimestamp(mtime).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):  # None, or a date out of range
        return "-" * 19


def _error(message):
    print(f"torch_pjrt.cache: {message}", file=sys.stderr)


def _size_arg(text):
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m torch_pjrt.cache",
        description="Inspect, prune or empty torch_pjrt's persistent executable cache.",
        epilog="Exit status: 0 done, 1 could not do all of it, 2 bad usage (see the "
               "module docstring of torch_pjrt/cache.py).")
    parser.add_argument("command", choices=["list", "size", "clear", "prune"])
    parser.add_argument("--dir", help="the cache directory (default: $TORCH_PJRT_CACHE_DIR, "
                                      "else ~/.cache/torch_pjrt/executables)")
    parser.add_argument("--max-size", type=_size_arg, default=argparse.SUPPRESS, metavar="SIZE",
                        help="prune: the size to get down to, e.g. 500M, 2G, 1.5GiB, 10GB "
                             f"(default: ${MAX_SIZE_ENV}, else 10 GiB)")
    return parser


def _summary(count, size, directory, bad=0):
    what = f"{count} entries" + (f" ({bad} BAD)" if bad else "")
    return f"{what}, {size} bytes ({_human(size)}) in {_shown(directory)}"


def _list(directory):
    found = entries(directory)
    for e in found:
        label = e.key[:16] if _HEX_KEY.fullmatch(e.key) else _shown(os.path.basename(e.path))
        detail = f"{e.platform}, program {e.program_bytes} bytes" if e.platform else ""
        status = "" if e.status == "ok" else f"  BAD: {_shown(e.status)}"
        print(f"{label}  {e.size:>10}  {_when(e.mtime)}  {detail}{status}")
    bad = sum(e.status != "ok" for e in found)
    print(_summary(len(found), sum(e.size for e in found), directory, bad))
    return 0


def _size(directory):
    count, size = total_size(directory)
    try:
        cap = max_size()
        cap_text = f"cap {_human(cap)}" if cap else "no cap"
    except ValueError as e:
        _error(f"{e}; the runtime uses the default cap")
        cap_text = f"cap {_human(DEFAULT_MAX_SIZE)}"
    print(f"{_summary(count, size, directory)}; {cap_text}")
    return 0


def _print_failures(failures):
    for line in _failure_lines(failures):
        _error(line)
    return 1 if failures else 0


def _clear_command(directory):
    removed, failures = _clear(directory)
    print(f"removed {removed} entries from {_shown(directory)}")
    return _print_failures(failures)


def _prune_command(directory, limit):
    result, failures = _prune(directory, limit)
    for path, size, mtime in result.removed:
        name = _shown(os.path.basename(path))[:16]
        print(f"removed {name}  {size:>10}  last used {_when(mtime)}")
    for path in result.temp_files:
        print(f"removed stale temporary file {_shown(os.path.basename(path))}")
    freed = sum(size for _, size, _ in result.removed)
    print(f"pruned {len(result.removed)} entries ({freed} bytes) and {len(result.temp_files)} "
          f"temporary files; left {_summary(result.count, result.total, directory)}")
    if not failures and limit is not None and result.total > limit:  # not expected
        failures = [("prune", directory, f"still {result.total} bytes, above {limit}")]
    return _print_failures(failures)


def _require_dir(directory):
    """An explicit --dir that is missing is a mistake, not an empty cache."""
    try:
        os.stat(directory)
    except FileNotFoundError:
        raise CacheError(f"no such directory: {_shown(directory)}") from None
    except OSError:
        pass  # listing says what is wrong


def _run(args):
    directory = _dir(args.dir)
    if directory is None:
        print("torch_pjrt: the persistent executable cache is disabled (TORCH_PJRT_CACHE_DIR is empty)")
        return 0
    if args.dir is not None:
        _require_dir(directory)
    if args.command == "prune":
        limit = getattr(args, "max_size", None)
        if not hasattr(args, "max_size"):
            try:
                limit = max_size()
            except ValueError as e:
                _error(f"{e}; give --max-size")
                return 2
        return _prune_command(directory, limit)
    if hasattr(args, "max_size"):
        _error(f"--max-size is for prune, not {args.command}")
        return 2
    return {"list": _list, "size": _size, "clear": _clear_command}[args.command](directory)


def main(argv=None):
    """The command line; returns the exit status (see the module docstring)."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # odd bytes in names never fail a print
            stream.reconfigure(errors="backslashreplace")
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except CacheError as e:
        _error(str(e))
        return 1
    except OSError as e:  # anything else the file system does: still one line
        where = f" {_shown(e.filename)}" if e.filename else ""
        _error(f"error on{where}: {_why(e)}")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `list | head`: the reader went away
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    sys.exit(status)
