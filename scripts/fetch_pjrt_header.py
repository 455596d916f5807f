"""Fetches the PJRT C API header (xla/pjrt/c/pjrt_c_api.h) into DEST/xla/pjrt/c/.

Used by scripts/setup.sh (DEST = third_party/include) and by CMakeLists.txt when
no header is there (a `pip install .` from a fresh clone; DEST in the build dir).
The header comes from the tensorflow-cpu wheel (pinned below; only the one
member is read, nothing is installed). Not from xla-cpu-pjrt's wheel: it ships
an older header (API minor 81; we build against 90).

    python scripts/fetch_pjrt_header.py DEST
"""
import glob
import os
import subprocess
import sys
import tempfile
import zipfile

TF_WHEEL_VERSION = "2.21.0"
MEMBER = "tensorflow/include/xla/pjrt/c/pjrt_c_api.h"


def fetch(dest):
    dst = os.path.join(dest, "xla", "pjrt", "c", "pjrt_c_api.h")
    if os.path.isfile(dst):
        return dst
    with tempfile.TemporaryDirectory() as dl:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "-d", dl, f"tensorflow-cpu=={TF_WHEEL_VERSION}"]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wheels = glob.glob(os.path.join(dl, "tensorflow_cpu-*.whl"))
        if r.returncode != 0 or not wheels:
            out = "\n".join(l for l in r.stdout.splitlines() if "is ignored: it is neither" not in l)
            raise SystemExit(f"fetch_pjrt_header: `{' '.join(cmd)}` failed:\n{out}\n"
                             "put pjrt_c_api.h into third_party/include/xla/pjrt/c/ by hand "
                             "(or pass -DPJRT_INCLUDE_DIR=DIR to CMake)")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = dst + ".part"
        with zipfile.ZipFile(wheels[0]) as z, open(tmp, "wb") as f:
            f.write(z.read(MEMBER))
        os.replace(tmp, dst)
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(fetch(sys.argv[1]))
