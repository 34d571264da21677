"""The shape of the code base: one door for checkpoints.

Checkpoint resolution and loading live in ``fireviz/checkpoints/catalog.py`` only: every other module
of the product (the library, the pages, the scripts and benchmarks) receives a loaded model
from ``checkpoints.load_model`` / ``resolve_checkpoint``. ``GPT.from_pretrained`` is the
model's own file format (fireviz/model/gpt.py) and is called from the door alone; downloads of
fireviz checkpoints happen there too (``fireviz/checkpoints/hub.py`` reads published transformers models,
a different thing: their config and bias tables only).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = sorted(
    [
        *ROOT.glob("fireviz/**/*.py"),
        *ROOT.glob("pages/*.py"),
        ROOT / "app.py",
        *ROOT.glob("scripts/*.py"),
        *ROOT.glob("benchmarks/*.py"),
    ]
)


def _calls(path: Path, names: set[str]) -> list[str]:
    """``file:line name`` for every call of a function or method named in ``names``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in names:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return out


def test_checkpoints_are_loaded_through_one_door():
    door = {"fireviz/checkpoints/catalog.py"}
    found = [
        c
        for p in PRODUCT
        if str(p.relative_to(ROOT)) not in door | {"fireviz/model/gpt.py"}
        for c in _calls(p, {"from_pretrained"})
    ]
    assert not found, f"load checkpoints with fireviz.checkpoints.catalog.load_model, not GPT.from_pretrained: {found}"
    fetch = [
        c
        for p in PRODUCT
        if str(p.relative_to(ROOT)) not in door | {"fireviz/model/gpt.py", "fireviz/checkpoints/hub.py"}
        and not str(p.relative_to(ROOT)).startswith("benchmarks/hub_fetch")  # measures the download itself
        for c in _calls(p, {"hf_hub_download", "snapshot_download"})
    ]
    assert not fetch, f"fetch checkpoints through fireviz.checkpoints: {fetch}"


def test_no_second_loader_or_identity_is_defined():
    defined = {}
    for p in PRODUCT:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name in {
                "load_checkpoint",
                "load_model",
                "checkpoint_sha256",
                "checkpoint_files",
            }:
                defined.setdefault(node.name, []).append(str(p.relative_to(ROOT)))
    # ui.load_model is the app's per-process cache (st.cache_resource) of checkpoints' loader
    # (load_model_with_identity: the model and the identity of the bytes it was loaded from)
    assert defined.pop("load_model") == ["fireviz/checkpoints/catalog.py", "fireviz/ui/picker.py"]
    assert "ck.load_model_with_identity(" in (ROOT / "fireviz/ui/picker.py").read_text()
    assert {k: v for k, v in defined.items() if v != ["fireviz/checkpoints/catalog.py"]} == {}, defined


#: compiled kernels (numba) are written as one loop nest on purpose
KERNELS = {("fireviz/encodings/fire.py", "_build_row_kernel")}


def test_no_module_over_600_lines_and_no_function_over_80():
    """One concept per module, functions that read on one screen (the issue's limits)."""
    long_modules = {
        str(p.relative_to(ROOT)): n for p in PRODUCT if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert not long_modules, long_modules
    long_functions = []
    for p in PRODUCT:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 80 and (str(p.relative_to(ROOT)), node.name) not in KERNELS:
                    long_functions.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long_functions, long_functions


def test_only_the_ui_package_imports_streamlit():
    importers = sorted(
        str(p.relative_to(ROOT))
        for p in ROOT.glob("fireviz/**/*.py")
        if "import streamlit" in p.read_text(encoding="utf-8")
    )
    assert importers and all(p.startswith("fireviz/ui/") for p in importers), importers
