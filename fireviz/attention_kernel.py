"""The compiled backward of ``BiasedAttention`` (fireviz/csrc/biased_attention.cpp), built once per machine.

``backward_kernel()`` returns the extension module (its ``biased_attention_backward``), compiling
it with the machine's C++ compiler through ``torch.utils.cpp_extension`` on first use (~30 s;
``-O3 -march=native``, so the build is keyed by this CPU as well as the source, flags, Python and
torch) and loading the cached build afterwards. Where it cannot be built (no C++ compiler or
ninja, a torch without the BLAS symbol), it warns once, naming what is missing, and returns None:
``BiasedAttention`` then runs its exact torch backward (same numbers, ~1.2× slower per layer).
``FIREVIZ_NO_CPP_KERNEL=1`` turns the kernel off; ``TORCH_EXTENSIONS_DIR`` moves the build cache.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import threading
import time
import warnings

import torch

SOURCE = os.path.join(os.path.dirname(__file__), "csrc", "biased_attention.cpp")
CFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp"]

#: a build lock older than this is left over from a killed build (torch's lock would wait forever)
STALE_LOCK_SECONDS = 600

_lock = threading.Lock()
_state: dict = {}  # "module": the loaded extension, or None once a build failed


def _cpu_identity() -> str:
    """The CPU's model and flags (what ``-march=native`` compiles for)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


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


def _build():
    from torch.utils.cpp_extension import load

    name, directory = build_name(), build_directory()
    os.makedirs(directory, exist_ok=True)
    lock = os.path.join(directory, "lock")
    if os.path.exists(lock) and time.time() - os.path.getmtime(lock) > STALE_LOCK_SECONDS:
        os.remove(lock)  # a build killed part-way left it; torch would wait on it forever
    if not any(f.startswith(name) and f.endswith(".so") for f in os.listdir(directory)):
        print("fireviz: compiling the biased-attention backward (once per machine, ~30 s)…", file=sys.stderr)
    # ninja from this environment's bin/ (the pip package) when the PATH has none
    bin_dir = os.path.dirname(sys.executable)
    os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), bin_dir]).strip(os.pathsep)
    return load(name=name, sources=[SOURCE], extra_cflags=CFLAGS, build_directory=directory, verbose=False)


def backward_kernel():
    """The compiled extension, or None (off, or it could not be built: warned once).

    Returns: the module whose ``biased_attention_backward(q, k, v, mask, out, lse, dout,
    mask_grad, chunk, underflow)`` returns ``[dq, dk, dv, dmask]`` (see the C++ source).
    """
    if os.environ.get("FIREVIZ_NO_CPP_KERNEL", "") not in ("", "0"):
        return None
    if "module" not in _state:
        with _lock:
            if "module" not in _state:
                try:
                    _state["module"] = _build()
                except Exception as err:  # no compiler, no ninja, a failed compile or link
                    _state["module"] = None
                    first_line = (str(err).strip().splitlines() or [type(err).__name__])[-1][:300]
                    warnings.warn(
                        f"fireviz: could not build the compiled biased-attention backward ({first_line}); "
                        "training on CPU uses the exact torch backward instead (~1.2× slower per layer). "
                        "Install a C++ compiler (g++) and ninja (pip install ninja) to get it, or set "
                        "FIREVIZ_NO_CPP_KERNEL=1 to silence this.",
                        RuntimeWarning,
                        stacklevel=2,
                    )
    return _state["module"]
