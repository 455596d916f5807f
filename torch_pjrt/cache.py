"""The persistent executable cache: where it is, what is in it, emptying it.

Every program the backend compiles is saved there (serialized by the PJRT
plugin) and loaded instead of compiled by later processes. The C++ runtime
(csrc/runtime/persistent_cache.{h,cpp}) reads and writes the entries; this
module only looks at the directory and never needs the plugin.

    python -m torch_pjrt.cache list|size|clear [--dir DIR]

Directory: $TORCH_PJRT_CACHE_DIR; set but empty disables the cache. Unset:
$XDG_CACHE_HOME/torch_pjrt/executables (absolute XDG_CACHE_HOME only), else
~/.cache/torch_pjrt/executables.
"""
import argparse
import collections
import datetime
import hashlib
import os
import pwd
import struct
import sys

MAGIC = b"TPJRTEXE"
FORMAT_VERSION = 1
HEADER_SIZE = 96
SUFFIX = ".pjrtexe"

__all__ = ["cache_dir", "entries", "total_size", "clear", "read_entry", "Entry", "main"]

Entry = collections.namedtuple(
    "Entry", "path key size mtime status platform plugin program_bytes payload_bytes identity")
Entry.__doc__ = """One cache file. status is "ok" or what is wrong with it (the
checks the runtime makes, except comparing the identity with the loaded plugin)."""


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
    return cache_dir() if directory is None else directory


def _identity_field(identity, name):
    for line in identity.splitlines():
        if line.startswith(name + "="):
            return line[len(name) + 1:]
    return ""


def read_entry(path):
    """Parses and checks one entry file (the whole file is read)."""
    st = os.stat(path)
    with open(path, "rb") as f:
        data = f.read()
    key = os.path.basename(path)[:-len(SUFFIX)]
    fields = dict(path=path, key=key, size=st.st_size, mtime=st.st_mtime, platform="",
                  plugin="", program_bytes=None, payload_bytes=None, identity="")

    def entry(status):
        return Entry(status=status, **fields)

    if data[:8] != MAGIC[:min(len(data), 8)]:
        return entry("not a torch_pjrt cache entry (bad magic)")
    if len(data) < HEADER_SIZE:
        return entry(f"truncated ({len(data)} of at least {HEADER_SIZE} bytes)")
    version, identity_size = struct.unpack_from("<II", data, 8)
    if version != FORMAT_VERSION:
        return entry(f"format version {version}, this build reads {FORMAT_VERSION}")
    stored_key = data[16:48]
    program_bytes, payload_bytes = struct.unpack_from("<QQ", data, 48)
    checksum = data[64:96]
    identity = data[HEADER_SIZE:HEADER_SIZE + identity_size].decode("utf-8", "replace")
    fields.update(program_bytes=program_bytes, payload_bytes=payload_bytes, identity=identity,
                  platform=" ".join(x for x in (_identity_field(identity, "platform"),
                                                _identity_field(identity, "attribute.xla_version")
                                                and "xla_version=" + _identity_field(
                                                    identity, "attribute.xla_version")) if x),
                  plugin=_identity_field(identity, "plugin_path"))
    expected = HEADER_SIZE + identity_size + payload_bytes
    if len(data) < expected:
        return entry(f"truncated ({len(data)} of {expected} bytes)")
    if len(data) > expected:
        return entry(f"size mismatch ({len(data)} bytes, header says {expected})")
    if stored_key.hex() != key:
        return entry(f"foreign entry (stored key {stored_key.hex()[:16]}... "
                     "does not match the file name)")
    if hashlib.sha256(data[HEADER_SIZE + identity_size:]).digest() != checksum:
        return entry("corrupted payload (checksum mismatch)")
    return entry("ok")


def _names(directory):
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []


def entries(directory=None):
    """The entries in the cache directory (default: cache_dir()), sorted by name."""
    directory = _dir(directory)
    if directory is None:
        return []
    out = []
    for name in _names(directory):
        if name.endswith(SUFFIX) and not name.startswith("."):
            try:
                out.append(read_entry(os.path.join(directory, name)))
            except FileNotFoundError:  # removed meanwhile
                pass
    return out


def total_size(directory=None):
    """(number of entries, total bytes) in the cache directory."""
    directory = _dir(directory)
    count = size = 0
    for name in _names(directory) if directory is not None else []:
        if name.endswith(SUFFIX) and not name.startswith("."):
            try:
                size += os.stat(os.path.join(directory, name)).st_size
                count += 1
            except FileNotFoundError:
                pass
    return count, size


def clear(directory=None):
    """Deletes every entry (and leftover temporary files of interrupted
    writes); returns the number of entries deleted."""
    directory = _dir(directory)
    removed = 0
    for name in _names(directory) if directory is not None else []:
        is_entry = name.endswith(SUFFIX) and not name.startswith(".")
        is_temp = name.startswith(".") and ".tmp." in name
        if is_entry or is_temp:
            try:
                os.unlink(os.path.join(directory, name))
                removed += is_entry
            except FileNotFoundError:
                pass
    return removed


def _human(n):
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m torch_pjrt.cache",
        description="Inspect or empty torch_pjrt's persistent executable cache.")
    parser.add_argument("command", choices=["list", "size", "clear"])
    parser.add_argument("--dir", help="the cache directory (default: $TORCH_PJRT_CACHE_DIR, "
                                      "else ~/.cache/torch_pjrt/executables)")
    args = parser.parse_args(argv)
    directory = _dir(args.dir)
    if directory is None:
        print("torch_pjrt: the persistent executable cache is disabled (TORCH_PJRT_CACHE_DIR is empty)")
        return 0
    if args.command == "list":
        found = entries(directory)
        for e in found:
            when = datetime.datetime.fromtimestamp(e.mtime).strftime("%Y-%m-%d %H:%M:%S")
            detail = f"{e.platform}, program {e.program_bytes} bytes" if e.platform else ""
            status = "" if e.status == "ok" else f"  BAD: {e.status}"
            print(f"{e.key[:16]}  {e.size:>10}  {when}  {detail}{status}")
        total = sum(e.size for e in found)
        print(f"{len(found)} entries, {total} bytes ({_human(total)}) in {directory}")
    elif args.command == "size":
        count, size = total_size(directory)
        print(f"{count} entries, {size} bytes ({_human(size)}) in {directory}")
    else:
        print(f"removed {clear(directory)} entries from {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
