"""Which PJRT plugin to load: env TORCH_PJRT_PLUGIN (a name or a path), else
tpu if libtpu finds a TPU, else cuda if a GPU and its plugin exist, else cpu."""
import glob
import os
import site
import sys


def search_roots():
    roots = []
    for p in list(sys.path) + site.getsitepackages() + [site.getusersitepackages()]:
        if p and os.path.isdir(p) and p not in roots:
            roots.append(p)
    return roots


def _tpu_present():
    # libtpu needs TPU chips: Google's accelerator PCI vendor id 0x1ae0.
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == "0x1ae0":
                    return True
        except OSError:
            pass
    return False


def _gpu_present():
    return any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/nvidiactl"))


def choose(C):
    """Returns (name, path) of the plugin to load."""
    roots = search_roots()
    wanted = os.environ.get("TORCH_PJRT_PLUGIN", "").strip()
    if wanted:
        path = C.resolve_plugin(wanted, roots)
        name = wanted if "/" not in wanted and not wanted.endswith(".so") else _name_of(path)
        return name, path
    found = dict(C.discover_plugins(roots))
    if "tpu" in found and _tpu_present():
        return "tpu", found["tpu"]
    if "cuda" in found and _gpu_present():
        return "cuda", found["cuda"]
    if "cpu" in found:
        return "cpu", found["cpu"]
    raise RuntimeError(
        "torch_pjrt: no usable PJRT plugin found (install xla-cpu-pjrt, jax-cuda13-pjrt or libtpu, "
        "or set TORCH_PJRT_PLUGIN to a plugin path)")


def _name_of(path):
    base = os.path.basename(path)
    if "cpu" in base:
        return "cpu"
    if "cuda" in base:
        return "cuda"
    if "tpu" in base:
        return "tpu"
    return os.path.splitext(base)[0]
