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

ROOT = Path(__file__).resolve().parents[2]
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
    # a published causal LM is built by transformers' own loader, in its one module (issue #36)
    published_door = {"fireviz/checkpoints/causal_lm.py"}
    found = [
        c
        for p in PRODUCT
        if str(p.relative_to(ROOT)) not in door | published_door | {"fireviz/model/gpt.py"}
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
                "load_checked",
                "checkpoint_sha256",
                "checkpoint_files",
            }:
                defined.setdefault(node.name, []).append(str(p.relative_to(ROOT)))
    # ui.load_model is the app's per-process cache (st.cache_resource) of Checkpoint.load, and
    # ui.picker.checkpoint_sha256 takes a CheckpointInfo as well as a path
    assert defined.pop("load_model") == ["fireviz/checkpoints/checkpoint.py", "fireviz/ui/picker.py"]
    assert defined.pop("checkpoint_sha256") == ["fireviz/checkpoints/catalog.py", "fireviz/ui/picker.py"]
    assert defined.pop("load_checked") == ["fireviz/model/state.py"]
    assert "Checkpoint.resolve(" in (ROOT / "fireviz/ui/picker.py").read_text()
    assert {k: v for k, v in defined.items() if v != ["fireviz/checkpoints/catalog.py"]} == {}, defined


def test_one_checkpoint_loader():
    """Model weights become tensors in one place, ``fireviz.model.load_checked`` (under
    ``Checkpoint.load`` and ``GPT.from_pretrained``); the other modules that import a safetensors
    reader read other files: the trainer's state, a saved fit, a published model's bias tables,
    the bounded header reader."""
    readers = set()
    for p in ROOT.glob("fireviz/**/*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("safetensors"):
                if {a.name for a in node.names} & {"load", "load_file", "safe_open"}:
                    readers.add(str(p.relative_to(ROOT)))
    other_files = {
        "fireviz/train/state.py",
        "fireviz/fit/result.py",
        "fireviz/checkpoints/hub.py",
        "fireviz/core/files.py",
    }
    assert readers - other_files == {"fireviz/model/state.py"}, readers


#: names a checkpoint's identity must not go by (it is ``sha256``, ``checkpoint_sha256`` in results)
OTHER_IDENTITY_NAMES = {"checkpoint_hash", "checkpoint_identity", "identity", "sha", "weights_fingerprint"}


def test_one_identity_name():
    """A checkpoint's identity is called ``sha256`` everywhere (``Checkpoint.sha256``, results'
    ``checkpoint_sha256``); no parameter, variable or attribute of fireviz calls it otherwise (the
    data's ``data_fingerprint`` is another thing); job descriptions key it ``sha256``."""
    found = []
    for p in ROOT.glob("fireviz/**/*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.arg):
                names = [node.arg]
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names = [node.id]
            elif isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value]  # a dict key such as {"fingerprint": ...}
            found += [f"{p.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n in OTHER_IDENTITY_NAMES]
    assert not found, found
    jobs = (ROOT / "fireviz/ui/jobs.py").read_text(encoding="utf-8")
    assert '"fingerprint"' not in jobs and '"sha256": ' in jobs


def test_no_keyword_list_of_evaluation_settings_outside_eval_settings():
    """The evaluation settings are spelled once, as ``EvalSettings``' fields: no function elsewhere
    above the evaluation package takes three or more of them as parameters (a caller passes an ``EvalSettings``, or ``**settings``
    that ``EvalSettings.make`` checks)."""
    from fireviz.eval import SETTING_NAMES

    names = set(SETTING_NAMES) - {"device", "split"}  # common words of other APIs too
    found = []
    for p in PRODUCT:
        if str(p.relative_to(ROOT)).startswith("fireviz/eval/"):  # the windows below take their own parameters
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = {a.arg for a in node.args.args + node.args.kwonlyargs}
                if len(args & names) >= 3:
                    found.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {sorted(args & names)}")
    assert not found, found


#: compiled kernels (numba) are written as one loop nest on purpose
KERNELS = {("fireviz/encodings/fire.py", "_build_row_kernel")}


def test_no_function_over_80_lines():
    """Functions that read on one screen. (Modules have no size cap: they are cut along concepts,
    and the package rules below keep their boundaries honest.)"""
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


# ---------------------------------------------------------------------------------------------
# Stage packages (issue #34): one package per stage, data flowing one way
# ---------------------------------------------------------------------------------------------
#: the stage packages from the bottom up; a package imports only packages before it in this
#: list (cli and ui are the two edges and import anything below them)
LAYERS = ["core", "encodings", "data", "model", "checkpoints", "train", "eval", "analysis", "fit", "plots", "cli", "ui"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, top_level_only: bool = False):
    """``(lineno, imported module, [names], at module level)`` for each fireviz import of a file
    (imports under ``if TYPE_CHECKING:`` are annotations only and are left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    typing_only = {
        id(m)
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
        for m in ast.walk(n)
    }
    me = _module_name(path)
    for node in ast.walk(tree):
        if (top_level_only and id(node) not in top) or id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            module, names = node.names[0].name, []
        else:
            continue
        if module == "fireviz" or module.startswith("fireviz."):
            yield node.lineno, module, names, id(node) in top


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


FIREVIZ = sorted(ROOT.glob("fireviz/**/*.py"))


def test_fireviz_is_made_of_the_stage_packages():
    top = sorted(p.name for p in (ROOT / "fireviz").iterdir() if p.suffix == ".py")
    assert top == ["__init__.py", "__main__.py"], f"modules belong in a stage package, not at the top: {top}"
    packages = sorted(p.name for p in (ROOT / "fireviz").iterdir() if (p / "__init__.py").exists())
    assert packages == sorted(LAYERS)
    for name in LAYERS:
        init = ROOT / "fireviz" / name / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), f"{init} needs a docstring"


def test_packages_import_only_the_stages_below_them():
    wrong = []
    for p in FIREVIZ:
        mine = _package(_module_name(p))
        if mine not in LAYERS:  # fireviz/__init__.py, fireviz/__main__.py
            continue
        for lineno, module, _, _ in _imports(p):
            theirs = _package(module) if module != "fireviz" else None
            if theirs is None and module != "fireviz":
                continue
            if module == "fireviz":  # the package itself: __version__ only
                continue
            if theirs != mine and LAYERS.index(theirs) > LAYERS.index(mine):
                wrong.append(f"{p.relative_to(ROOT)}:{lineno} ({mine}) imports {module} ({theirs})")
    assert not wrong, "an import against the flow core → … → plots → cli/ui:\n" + "\n".join(wrong)


def test_no_private_name_crosses_a_package_boundary():
    private = []
    for p in [*FIREVIZ, *ROOT.glob("pages/*.py"), ROOT / "app.py", *ROOT.glob("scripts/*.py")]:
        mine = _package(_module_name(p)) if p.is_relative_to(ROOT / "fireviz") else "outside"
        for lineno, module, names, _ in _imports(p):
            if _package(module) != mine:
                private += [
                    f"{p.relative_to(ROOT)}:{lineno} {module}.{n}"
                    for n in names
                    if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))
                ]
    assert not private, private


def test_no_import_cycle_between_modules():
    graph = {}
    for p in FIREVIZ:
        edges = set()
        for _, module, names, _top in _imports(p, top_level_only=True):
            for n in names:  # `from fireviz.pkg import module` imports that module
                if (ROOT / module.replace(".", "/") / f"{n}.py").exists():
                    edges.add(f"{module}.{n}")
            edges.add(module)
        graph[_module_name(p)] = edges
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph or nxt == node or node.startswith(nxt + "."):
                continue  # a package importing its own submodule, or a parent package's __init__
            if state.get(nxt) == 1:
                return [*stack, node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*stack, node])):
                return cycle
        state[node] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m, [])
            assert cycle is None, " → ".join(cycle)


def test_internal_imports_are_at_the_top_of_their_module():
    inner = [
        f"{p.relative_to(ROOT)}:{lineno} {module}" for p in FIREVIZ for lineno, module, _, top in _imports(p) if not top
    ]
    assert not inner, "move these imports to the top of their module:\n" + "\n".join(inner)
