"""Finds and loads the compiled extension (torch_pjrt_C): the installed one
inside this package (pip install .), else the dev build folder
(TORCH_PJRT_BUILD_DIR, or build/ at the repository root)."""
import glob
import importlib.machinery
import importlib.util
import os

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_PACKAGE)


def _find():
    found = sorted(glob.glob(os.path.join(_PACKAGE, "torch_pjrt_C*.so")))
    if found:
        return found[0], os.path.join(_PACKAGE, "_build_info.py")
    build = os.environ.get("TORCH_PJRT_BUILD_DIR") or os.path.join(_ROOT, "build")
    found = sorted(glob.glob(os.path.join(build, "torch_pjrt_C*.so")))
    if not found:
        raise ImportError(
            f"torch_pjrt: the C++ extension is not built (nothing in {build}); "
            "run scripts/setup.sh")
    return found[0], os.path.join(build, "_build_info.py")


def _base(version):
    return version.split("+")[0]


def check_torch(build_info, torch_version):
    """The extension links against torch's C++ API, whose ABI changes between
    releases: it must run with the torch it was built against (same X.Y.Z; the
    local label such as +cpu may differ)."""
    if not os.path.isfile(build_info):
        return  # a dev build configured before the build info existed
    info = {}
    with open(build_info) as f:
        exec(compile(f.read(), build_info, "exec"), info)
    built = info.get("TORCH_VERSION", "")
    if built and _base(built) != _base(torch_version):
        raise ImportError(
            f"torch_pjrt: the extension was built against torch {built}, but torch {torch_version} "
            f"is installed; reinstall torch=={_base(built)} or rebuild torch_pjrt against this torch "
            "(pip install . --no-build-isolation)")


def load_extension():
    import torch

    path, build_info = _find()
    check_torch(build_info, torch.__version__)
    loader = importlib.machinery.ExtensionFileLoader("torch_pjrt_C", path)
    spec = importlib.util.spec_from_file_location("torch_pjrt_C", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
