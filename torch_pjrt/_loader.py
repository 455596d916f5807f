"""Finds and loads the compiled extension (torch_pjrt_C) from the build folder."""
import glob
import importlib.machinery
import importlib.util
import os

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_extension():
    build = os.environ.get("TORCH_PJRT_BUILD_DIR") or os.path.join(_ROOT, "build")
    found = sorted(glob.glob(os.path.join(build, "torch_pjrt_C*.so")))
    if not found:
        raise ImportError(
            f"torch_pjrt: the C++ extension is not built (nothing in {build}); "
            "run scripts/setup.sh")
    loader = importlib.machinery.ExtensionFileLoader("torch_pjrt_C", found[0])
    spec = importlib.util.spec_from_file_location("torch_pjrt_C", found[0], loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
