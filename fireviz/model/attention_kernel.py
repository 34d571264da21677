"""The compiled backward of ``BiasedAttention`` (fireviz/model/csrc/biased_attention.cpp), built once per machine.

``backward_kernel()`` returns the extension module (its ``biased_attention_backward``), compiling
it with the machine's C++ compiler through ``torch.utils.cpp_extension`` on first use (~30 s;
``-O3 -march=native``, so the build is keyed by this CPU as well as the source, flags, Python and
torch) and loading the cached build afterwards. Where it cannot be built (no C++ compiler or
ninja, a torch without the BLAS symbol), it warns once, naming what is missing, and returns None:
``BiasedAttention`` then runs its exact torch backward (same numbers; the training step ~1.2× slower).
``FIREVIZ_NO_CPP_KERNEL`` set to anything but 0 turns the kernel off; ``TORCH_EXTENSIONS_DIR``
moves the build cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import platform
import shutil
import sys
import warnings

import torch

from fireviz.core import LazyKernel

SOURCE = os.path.join(os.path.dirname(__file__), "csrc", "biased_attention.cpp")
CFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp"]

#: /proc/cpuinfo fields that say what ``-march=native`` compiles for (x86 and ARM spellings)
CPU_FIELDS = (
    "vendor_id",
    "cpu family",
    "model",
    "model name",
    "flags",
    "Features",
    "CPU implementer",
    "CPU architecture",
    "CPU variant",
    "CPU part",
)


def _cpu_identity() -> str:
    """The CPU's model and instruction-set flags, and the machine type."""
    fields = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in CPU_FIELDS:
                    fields.add(f"{key.strip()}:{value.strip()}")
    except OSError:
        fields.add(platform.processor())
    return platform.machine() + "\n" + "\n".join(sorted(fields))


def build_name() -> str:
    """The extension's name: source, flags, CPU, Python and torch hashed, so no build is reused elsewhere."""
    with open(SOURCE, "rb") as f:
        source = f.read()
    key = b"\0".join(
        [source, " ".join(CFLAGS).encode(), _cpu_identity().encode(), sys.version.encode(), torch.__version__.encode()]
    )
    return "fireviz_biased_attention_" + hashlib.sha256(key).hexdigest()[:16]


def build_directory() -> str:
    """Where the build lives: ``$TORCH_EXTENSIONS_DIR`` or torch's default root, then fireviz/<name>."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return os.path.join(root, "fireviz", build_name())


@contextlib.contextmanager
def _build_lock(directory: str):
    """Hold an exclusive ``flock`` on the build folder: the kernel releases it when its holder
    dies, so a build killed part-way never blocks the next one (torch's own ``lock`` file would
    make it wait forever; under this lock such a file is always stale and is removed)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's lock file alone
        yield
        return
    with open(os.path.join(directory, "fireviz.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, "lock"))
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _import(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .so path always has a spec and a loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build():
    """Import the cached build, or compile it first (under the build folder's lock).

    The build's name already keys it by source, flags, CPU, Python and torch, so an existing
    library is imported directly: ninja's own records (absolute paths, its version) never
    trigger a rebuild from another checkout or PATH.
    """
    from torch.utils.cpp_extension import load

    directory = build_directory()
    name = os.path.basename(directory)
    os.makedirs(directory, exist_ok=True)
    library = os.path.join(directory, name + ".so")
    with _build_lock(directory):
        if os.path.exists(library):
            try:
                return _import(name, library)
            except ImportError:  # a library cut short (a killed link): built again below
                pass
        compiler = os.environ.get("CXX", "c++")  # what torch's build runs
        if shutil.which(compiler) is None:
            raise RuntimeError(f"no C++ compiler: {compiler!r} is not on the PATH")
        print("fireviz: compiling the biased-attention backward (once per machine, ~30 s)…", file=sys.stderr)
        path = os.environ.get("PATH", "")
        bin_dir = os.path.dirname(sys.executable)  # this environment's ninja (requirements.txt) first
        os.environ["PATH"] = os.pathsep.join(p for p in (bin_dir, path) if p)
        try:
            return load(name=name, sources=[SOURCE], extra_cflags=CFLAGS, build_directory=directory, verbose=False)
        finally:
            os.environ["PATH"] = path


def _warn_unavailable(err: BaseException) -> None:
    reason = next((ln for ln in reversed(str(err).strip().splitlines()) if ln.strip()), "")
    warnings.warn(
        f"fireviz: could not build or load the compiled biased-attention backward "
        f"({type(err).__name__}: {reason[:300]}); CPU training uses the exact torch backward "
        "instead (its training step ~1.2× slower). Install a C++ compiler (g++) and ninja "
        "(pip install ninja), make the build cache writable (TORCH_EXTENSIONS_DIR, default "
        "~/.cache/torch_extensions), or set FIREVIZ_NO_CPP_KERNEL=1 to silence this.",
        RuntimeWarning,
        stacklevel=4,
    )


#: ``backward_kernel()``: the compiled extension, or None (off, or it could not be built: warned
#: once). Its ``biased_attention_backward(q, k, v, mask, out, lse, dout, mask_grad, chunk,
#: underflow)`` returns ``[dq, dk, dv, dmask]`` (see the C++ source). Any build error (no
#: compiler, no ninja, a failed compile or link, no cache folder) means unavailable.
backward_kernel = LazyKernel(
    _build, off_switch="FIREVIZ_NO_CPP_KERNEL", unavailable=(Exception,), on_unavailable=_warn_unavailable
)
