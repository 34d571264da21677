"""``python -m fireviz fit``: parse the arguments into ``fireviz.fit.fitting.FitSettings`` and run ``fireviz.fit.fitting.run_fit``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from fireviz.checkpoints import checkpoint_folder, hub
from fireviz.core import output_path_problem, write_json_atomic
from fireviz.encodings import FitParam
from fireviz.fit import BEYOND_FACTOR, DEFAULT_LR, DEFAULT_STEPS, FitSettings, run_fit, target_names
from fireviz.fit.result import json_safe
from fireviz.fit.targets import target_fit_params
from fireviz.model import CheckpointError


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
class _CLIError(Exception):
    pass


#: the options of the fit itself; a target parameter's flag never takes one (it becomes --target-<flag>)
_FIT_FLAGS = frozenset("h help target max-len heads width steps seed lr out save-module no-curves quiet param".split())


def param_flags() -> dict[str, dict[str, FitParam]]:
    """Each target-parameter flag (without ``--``) → ``{target: its FitParam}``, from the specs'
    ``fit_params`` (and the checkpoint target's), in target order: one flag per parameter name
    (or per ``FitParam.cli_flag``), shared by the targets that take it."""
    flags: dict[str, dict[str, FitParam]] = {}
    for target in target_names():
        for param in target_fit_params(target):
            flag = param.flag if param.flag not in _FIT_FLAGS else f"target-{param.flag}"
            flags.setdefault(flag, {})[target] = param
    return flags


def _flag_help(by_target: dict[str, FitParam]) -> str:
    """``"kerple_log, kerple_power: r1, one number or one per head; …"``: each distinct help with its targets."""
    helps: dict[str, list[str]] = {}
    for target, param in by_target.items():
        text = param.help or (f"{param.name} (a JSON value)" if param.kind == "any" else param.name)
        if param.default is not None:
            text += f" (default {param.default})"
        helps.setdefault(text, []).append(target)
    return "; ".join(f"{', '.join(targets)}: {text}" for text, targets in helps.items()).replace("%", "%%")


def _add_param_flag(group, flag: str, by_target: dict[str, FitParam]) -> None:
    """``--flag``: typed by argparse where every target reads it alike (int, float, a choice),
    else text read by the target's ``FitParam.from_text`` (``_target_from_args``)."""
    params = list(by_target.values())
    kinds = {p.kind if p.kind != "seed" else "int" for p in params}
    kw: dict = {}
    if len(kinds) == 1 and all(p.parse is None for p in params):
        kind = kinds.pop()
        if kind in ("int", "float"):
            kw["type"] = int if kind == "int" else float
        elif kind == "choice" and len({p.choices for p in params}) == 1:
            kw["choices"] = params[0].choices
    group.add_argument(f"--{flag}", help=_flag_help(by_target), **kw)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fireviz fit",
        description="Fit FIRE (Li et al. 2024) to a T5/ALiBi/Kerple/Sandwich bias or a checkpoint's "
        "learned bias (Theorem 3.1) on all pairs 0 <= j <= i < max-len.",
    )
    p.add_argument(
        "--target",
        required=True,
        help=f"one of {', '.join(target_names())}, or a checkpoint folder, a transformers model folder or a Hub id",
    )
    p.add_argument("--max-len", type=int, required=True, help="fitted range in tokens (>= 2)")
    p.add_argument("--heads", type=int, default=None, help="heads (default 8; a checkpoint's own)")
    p.add_argument("--width", type=int, default=32, help="FIRE MLP width (default 32)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"refinement steps (default {DEFAULT_STEPS})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=DEFAULT_LR, help=f"Adam learning rate (default {DEFAULT_LR})")
    p.add_argument("--out", default=None, help="write the result JSON here (FitResult.to_dict)")
    p.add_argument("--save-module", default=None, help="write the fitted FIRE here (safetensors)")
    p.add_argument("--no-curves", action="store_true", help="leave per-distance curves out of the JSON")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    g = p.add_argument_group("target parameters", "each from the target's spec (EncodingSpec.fit_params)")
    for flag, by_target in param_flags().items():
        _add_param_flag(g, flag, by_target)
    g.add_argument(
        "--param",
        action="append",
        metavar="NAME=VALUE",
        help="any target's parameter as JSON (repeatable), e.g. --param r2=0.5 (see make_target)",
    )
    return p


def _target_from_args(a: argparse.Namespace) -> tuple[str, int | None, dict]:
    """``(target name, heads, target parameters)`` from the flags; nothing is read or built here."""

    # --target <model>: a folder, a bundled name (fire, copy/fire; a misspelt group member raises here) or a Hub id
    if a.target not in target_names() and (checkpoint_folder(a.target) is not None or hub.looks_like_hub_id(a.target)):
        if a.checkpoint is not None:
            raise _CLIError("give the model once: --target <folder or Hub id>, or --target checkpoint --checkpoint …")
        a.checkpoint, a.target = a.target, "checkpoint"  # --target <model>: a checkpoint or published model
    if a.target not in target_names():
        looks_like_path = "/" in a.target or os.sep in a.target or a.target.startswith((".", "~"))
        raise _CLIError(
            f"--target {a.target!r} is no checkpoint folder (no such directory)"
            if looks_like_path
            else f"unknown --target {a.target!r}; choose one of {', '.join(target_names())}, or a checkpoint "
            "(a folder, a bundled checkpoint's name such as fire, or a Hub id)"
        )
    params = {}
    for item in a.param or []:  # --param NAME=VALUE (JSON value): any target's parameter
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise _CLIError(f"--param takes NAME=VALUE (got {item!r}), e.g. --param slope=0.5")
        try:
            params[name.strip()] = json.loads(value)
        except ValueError:
            params[name.strip()] = value  # a bare word, e.g. values=decay
    for flag, by_target in param_flags().items():  # --<flag> VALUE: a parameter of the targets that take it
        value = getattr(a, flag.replace("-", "_"), None)
        if value is None:
            continue
        param = by_target.get(a.target)
        if param is None:
            raise _CLIError(f"--{flag} applies to {'/'.join(by_target)}, not --target {a.target}")
        if isinstance(value, str):
            try:
                value = param.from_text(value, f"--{flag}")
            except ValueError as e:
                raise _CLIError(str(e)) from None
        params[param.name] = value
    if a.target == "checkpoint" and "path" not in params:
        raise _CLIError("--target checkpoint needs --checkpoint PATH (a checkpoint folder)")
    heads = a.heads if a.heads is not None or a.target == "checkpoint" else 8
    return a.target, heads, params


def settings_from_args(a: argparse.Namespace) -> FitSettings:
    """The fit the parsed arguments ask for (target, ``--max-len``, ``--heads``, ``--width``,
    ``--steps``, ``--seed``, ``--lr``): ``FitSettings.make``, which checks the numbers before a
    checkpoint target is read.

    Raises: _CLIError for flags that do not go together; ValueError / CheckpointError from
      ``FitSettings.make`` (and ``make_target``)."""
    name, heads, params = _target_from_args(a)
    return FitSettings.make(name, a.max_len, heads, a.width, a.steps, a.seed, a.lr, target_params=params)


def main(argv: list[str] | None = None) -> int:
    """``python -m fireviz fit --target NAME --max-len N [--heads H] [--width W] [--out fit.json]``.

    Parses the arguments into ``FitSettings`` (:func:`settings_from_args`), fits FIRE
    (``run_fit``), prints a one-line summary, writes ``FitResult.to_dict()`` as
    JSON to ``--out`` (keys include ``relative_rmse``, ``max_abs_error``,
    ``relative_rmse_beyond``, ``seconds``) and the module to ``--save-module``.
    Returns: 0 on success; 2 for bad arguments or parameters (one error line on stderr,
    no traceback).
    """
    parser = _parser()
    try:
        a = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed usage + the error
        return int(e.code or 0)
    for flag, out, example in (("--out", a.out, "fit.json"), ("--save-module", a.save_module, "fire_fit.safetensors")):
        if out is not None and (
            problem := output_path_problem(out, flag, example)
        ):  # refuse before computing, not after
            print(f"fireviz fit: error: {problem}", file=sys.stderr)
            return 2
    try:
        settings = settings_from_args(a)
        last = [0.0]

        def report_start(done: int, total: int) -> None:
            now = time.perf_counter()
            if not a.quiet and (done == total or now - last[0] > 1.0):
                last[0] = now
                print(f"closed-form start: candidate c {done}/{total}", file=sys.stderr)

        def report(step: int, total: int, loss: float) -> None:
            now = time.perf_counter()
            if not a.quiet and (step == total or now - last[0] > 1.0):
                last[0] = now
                print(f"step {step}/{total}  loss {loss:.3e}", file=sys.stderr)

        if not a.quiet:
            print(f"fitting {settings.caption()}…", file=sys.stderr)
        result = run_fit(settings, progress=report, start_progress=report_start)
    except _CLIError as e:
        print(f"fireviz fit: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, CheckpointError) as e:
        print(f"fireviz fit: error: {e}", file=sys.stderr)
        return 2
    summary = (
        f"{settings.target.name}: max_len={settings.max_len} heads={settings.num_heads} width={settings.mlp_width}  "
        f"relative RMSE {100 * result.relative_rmse:.3f}%  max |err| {result.max_abs_error:.3g} logits  "
        f"beyond (to {BEYOND_FACTOR}x) relative RMSE {100 * result.relative_rmse_beyond:.1f}%  "
        f"{result.seconds:.2f} s"
    )
    print(summary)
    from safetensors import SafetensorError

    try:  # atomic writes create missing parent folders; nothing half-written is left behind
        if a.out:
            write_json_atomic(a.out, json_safe(result.to_dict(curves=not a.no_curves)))
        if a.save_module:
            result.save(a.save_module)
    except (OSError, SafetensorError) as e:  # a place that takes no file (/proc, a full disk)
        print(f"fireviz fit: error: cannot write the result: {e}", file=sys.stderr)
        return 2
    return 0
