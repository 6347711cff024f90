"""Compose-time errors as one line: the CLI composes a single run's config once before Hydra does.

Hydra reports a bad override (wrong type, unknown enum value, unknown preset) as a multi-line
message with exit code 1, and lists schema nodes (`*_schema`) among the options. A single run
(not `--multirun`, `--cfg`, `--help`) is composed here first with the same overrides and checked
with `validate_run` (ranges, cross-field meaning); a failure becomes `error: config field '<key>':
<problem> — fix: <options>` and exit code 2, before Hydra creates the run directory, so a bad
config writes nothing. Before that, a run's or a sweep's overrides are parsed with Hydra's own
grammar (`check_grammar`: how to quote a path, a key given two values) and the default run
directory's parent is checked for write permission.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from stratacl import workload_registry
from stratacl.config import RENAMED_KNOBS, selected_libraries, to_object, validate_run
from stratacl.errors import ConfigError
from stratacl.paths import CONF

# flags whose value is the next argument (not an override)
_VALUE_FLAGS = {"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-p", "--package",
                "--experimental-rerun", "-sc", "--shell-completion"}
# flags after which Hydra does something other than one run (sweeps, printing, help)
_OTHER_MODES = {"-m", "--multirun", "-c", "--cfg", "-h", "--help", "--hydra-help", "-i", "--info",
                "--shell-completion", "-sc", "-cp", "--config-path", "-cn", "--config-name", "-cd",
                "--config-dir", "-p", "--package", "--experimental-rerun"}


def options(group: str) -> list[str]:
    """The user-facing choices of a config group (schema nodes left out; workloads: the registry's,
    which include packages that ship no YAML of their own)."""
    if group == "workload":
        return sorted(workload_registry.specs())
    d = CONF / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def one_line(exc: BaseException) -> str:
    """`config field '<key>': <problem> — fix: <hint>` from a Hydra/OmegaConf composition error."""
    parts: list[str] = []
    e: BaseException | None = exc
    while e is not None and len(parts) < 4:  # Hydra wraps the OmegaConf error that has the details
        parts.append(str(e))
        e = e.__cause__ or e.__context__
    text = "\n".join(parts)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    key = re.search(r"full_key:\s*(\S+)", text)
    missing = re.search(r"Could not (?:find|load) '([\w/]+)/([^']*)'", text)
    override = re.search(r"(?:Error merging override|Could not override '?)\s*([^\s=']+)", text)
    if missing:
        group, name = missing.groups()
        return (f"config field '{group}': unknown {group} '{name}' — fix: use one of "
                f"{', '.join(options(group))}")
    field = key.group(1) if key else (override.group(1) if override else "config")
    skip = ("Error merging", "Could not override", "To append", "full_key", "reference_type", "object_type",
            "Set the environment")
    problem = next((ln for ln in lines if not ln.startswith(skip)), lines[0] if lines else repr(exc))
    fix = "check the override's key and value (`python -m stratacl.run --cfg job` prints the config)"
    if "expected one of" in problem:
        fix = "use one of the listed values"
    elif "is not a subclass of ModelRef" in problem:  # llm_train / interference named it flat before
        fix = f"name the model as {field}.preset=<name>, one of {', '.join(options('model'))}"
    elif (old := re.search(r"Key '(\w+)' not in", problem)) and old.group(1) in RENAMED_KNOBS:
        fix = f"it moved: use {RENAMED_KNOBS[old.group(1)]}"
    elif "Key '" in problem and "not in struct" in problem:
        fix = "check the key's spelling; to add a new key use +key=value"
    return f"config field '{field}': {problem} — fix: {fix}"


def misplaced(overrides: list[str]) -> str:
    """The one-line error for an override that names something not in this config, when Hydra's
    own hint (`+key=value`) would send the user the wrong way: a knob of a library that is not
    selected, or a model chosen as a top-level group. "" when no override is of that kind."""
    for ov in overrides:
        key = ov.partition("=")[0].lstrip("+~")
        parts = key.split(".")
        if parts[0] == "model" and len(parts) == 1:
            return str(ConfigError("model", "a model is chosen inside the workload that runs it, not as a "
                                   "top-level group", "workload.model.preset=<name> (workload=llm_infer or "
                                   f"llm_train), one of {', '.join(options('model'))}"))
        if parts[0] != "library" or len(parts) < 2:
            continue
        selected = _selected_libraries(overrides)
        name = parts[1]
        if selected is None or name in selected:
            continue
        if name not in options("library"):
            return str(ConfigError(f"library.{name}", f"unknown library '{name}'",
                                   f"use one of {', '.join(options('library'))}"))
        return str(ConfigError(key, f"library '{name}' is not selected (selected: {', '.join(selected)})",
                               f"select it: library=[{','.join([*selected, name])}] (then {key.removeprefix('+')}=...)"))
    return ""


def _selected_libraries(overrides: list[str]) -> list[str] | None:
    """The libraries the run selects, from the config composed without per-library overrides."""
    keep = [o for o in overrides if not o.lstrip("+~").startswith("library.") and o.partition("=")[0] != "model"]
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            return selected_libraries(compose("config", overrides=keep))
    except (HydraException, OmegaConfBaseException, ValueError):
        return None


def _dir_override(argv: list[str], key: str) -> str | None:
    """The value of a `hydra.<run|sweep>.dir=...` override (quotes stripped), None if absent."""
    found = None
    for a in argv:
        k, eq, value = a.partition("=")
        if eq and k.lstrip("+") == key:
            found = value.strip().strip("'\"").strip()
    return found


def override_args(argv: list[str]) -> list[str]:
    """The arguments Hydra reads as overrides: not flags, not a flag's value."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a.startswith("-"):
            skip = a in _VALUE_FLAGS
        else:
            out.append(a)
    return out


QUOTE_FIX = "quote the value, shell quotes outside Hydra's: "


def check_grammar(args: list[str]) -> None:
    """Hydra's override grammar refuses a value the shell split at a space (`k=/a b` unquoted),
    non-ASCII characters and `=` outside quotes, with a multi-line message and exit 1, after the
    run directory exists; refuse them here first, saying how to quote. A key given two values is
    refused too: Hydra would keep the last one silently."""
    parser = OverridesParser.create()
    seen: dict[tuple[str, str | None], str] = {}
    for i, arg in enumerate(args):
        try:
            override = parser.parse_overrides([arg])[0]
        except OverrideParseException as exc:
            _refuse(*_grammar_error(args, i, exc))
        key = (override.key_or_group, override.package)
        if key in seen and seen[key] != arg:  # the same override repeated means one thing
            _refuse(override.key_or_group, f"given twice ('{seen[key]}' and '{arg}'): which one is meant?",
                    "give each key once (a sweep lists its values in one override: key=a,b with --multirun)")
        seen[key] = arg


def _grammar_error(args: list[str], i: int, exc: OverrideParseException) -> tuple[str, str, str]:
    arg = args[i]
    key, eq, value = arg.partition("=")
    if not eq:  # a word without '=': most often the rest of a value the shell split at a space
        prev_key, prev_eq, prev_value = args[i - 1].partition("=") if i else ("", "", "")
        if prev_eq:
            joined = f"{prev_value} {arg}".strip().strip("'\"")
            return (prev_key.lstrip("+~"), f"'{arg}' is not key=value: the shell split the value "
                    f"'{prev_value} {arg}' at a space", QUOTE_FIX + f"'{prev_key}=\"{joined}\"'")
        return ("config", f"'{arg}' is not key=value", "give overrides as key=value")
    detail = str(exc).splitlines()[0].split(": ", 1)[-1] if "Lexer" not in str(exc) else "character Hydra cannot read"
    clean = value.strip().strip("'\"")
    if not value.isascii():
        detail = "a non-ASCII character outside quotes"
    if value.isascii() and not set(value) & set(" ='\"\\$&;|<>()*?!#"):  # not a quoting problem: a list, a brace
        return (key.lstrip("+~"), f"cannot parse '{arg}' ({detail})",
                "check its syntax: key=value, a list as key=[a,b] (Hydra's override grammar)")
    quoted = f"'{key}=\"{clean}\"'" if "'" not in clean else f'"{key}=\\"{clean}\\""'
    return (key.lstrip("+~"), f"cannot parse '{arg}' ({detail})",
            QUOTE_FIX + f"{quoted} (a path with spaces the same: 'key=\"/path/with space\"')")


def check_model_source(argv: list[str]) -> None:
    """A preset and a config_json / model_type both given on the command line name two models: the
    run would have to drop one, so refuse rather than guess (a config_json or model_type alone
    replaces the workload's default preset, workloads/common/model_schema.py)."""
    given = {}
    for a in argv:
        k, eq, value = a.partition("=")
        key = k.lstrip("+~")
        if eq and key.startswith("workload.model.") and value.strip().strip("'\"").strip() not in ("", "null"):
            given[key.removeprefix("workload.model.")] = value
    own = [k for k in ("config_json", "model_type") if k in given]
    if "preset" in given and own:
        _refuse("workload.model.preset", f"preset '{given['preset']}' and {own[0]} '{given[own[0]]}' both "
                "name the model", f"drop workload.model.preset (a {own[0]} replaces the preset) or drop "
                f"workload.model.{own[0]}")


def _refuse(field: str, problem: str, fix: str) -> None:
    print(f"error: {ConfigError(field, problem, fix)}", file=sys.stderr)
    sys.exit(2)


def check_dirs(argv: list[str], multirun: bool) -> None:
    """Before Hydra creates anything: an empty output directory would put the run into the current
    directory (Hydra reads '' as '.'), so refuse it for the mode that uses it."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    if _dir_override(argv, key) == "":
        _refuse(key, "is empty (the run would write into the current directory)",
                f"give a directory, e.g. {key}=runs/mine, or drop the override for the default")


def _check_run_dir(argv: list[str]) -> None:
    """Hydra creates the run directory and writes `.hydra/` into it before any of our code runs: a
    directory that already holds a run's results would end up with that run's results and this
    run's config, and an unwritable one in Hydra's traceback — so check both first."""
    value = _dir_override(argv, "hydra.run.dir")
    if not value:
        _check_default_dir()
        return
    held = [f for f in HELD if (Path(value) / f).exists()]
    if held:
        _refuse("hydra.run.dir", f"'{value}' already holds a run ({', '.join(held)})",
                "choose a new hydra.run.dir (or delete that run directory first)")
    try:
        Path(value).mkdir(parents=True, exist_ok=True)
        probe = Path(value) / ".write_probe"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        _refuse("hydra.run.dir", f"cannot write '{value}': {exc.strerror or exc}", "a writable directory")


def _check_default_dir() -> None:
    """The default run directory (conf/config.yaml: runs/<date>/...) is created by the `fresh_dir`
    resolver inside Hydra, where a permission error is a traceback: check that its nearest
    existing ancestor lets this user create it."""
    parent = default_run_parent()
    ancestor = parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor.is_dir() and os.access(ancestor, os.W_OK | os.X_OK):
        return
    _refuse("hydra.run.dir", f"cannot create the default run directory under '{parent}': '{ancestor}' "
            "is not writable by this user", "run from a directory where you may write runs/, or pass "
            "hydra.run.dir=<a writable directory>")


def default_run_parent() -> Path:
    """The directory the default hydra.run.dir is created in, today: `runs/<date>` (its
    interpolations up to the first one only a run can resolve)."""
    raw = str(OmegaConf.load(CONF / "config.yaml").hydra.run._get_node("dir")._value())
    raw = re.sub(r"^\$\{fresh_dir:(.*)\}$", r"\1", raw)
    raw = re.sub(r"\$\{now:([^}]*)\}", lambda m: time.strftime(m.group(1)), raw)
    static = raw.split("${", 1)[0]
    return Path(static if static.endswith("/") else os.path.dirname(static) or ".")


# what marks a directory as holding a run's results (the CLI's outputs; summary.json last)
HELD = ("summary.json", "results.parquet")


def config_overrides(argv: list[str]) -> list[str]:
    """The overrides that shape the composed config: not flags, no hydra.* settings but the search
    path (a user's own config directory, e.g. library presets of plugins: docs/extending.md)."""
    return [a for a in argv if not a.startswith("-")
            and (not a.lstrip("+~").startswith("hydra") or a.lstrip("+~").startswith("hydra.searchpath="))]


def print_help(argv: list[str]) -> None:
    """`--help`: the choices a user can pass (Hydra's own listing also shows the `*_schema` nodes
    and `model`, which is no top-level group), then the composed config."""
    overrides = config_overrides(argv)
    print("python -m stratacl.run [group=option ...] [key=value ...]   (--hydra-help: Hydra's flags)\n")
    print("Groups (group=option):")
    for group in ("workload", "fabric", "library", "experiment"):
        how = {"library": " (a list: library=[a,b])", "experiment": " (+experiment=<name>)"}.get(group, "")
        print(f"  {group}{how}: {', '.join(options(group))}")
    print(f"  model presets (workload.model.preset=<name>, workload=llm_infer or llm_train): "
          f"{', '.join(options('model'))}")
    print("  sweeps: --multirun hydra/launcher=local (joblib, default), slurm, submitit_local or ray\n")
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            print(OmegaConf.to_yaml(compose("config", overrides=overrides)))
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        print(f"error: {misplaced(overrides) or one_line(exc)}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0)


def precheck(argv: list[str]) -> None:
    """Compose a single run's config; exit 2 with one line if Hydra would refuse it."""
    if any(a in ("-h", "--help") for a in argv):
        print_help(argv)
    multirun = any(a in ("-m", "--multirun") for a in argv)
    if not any(a.split("=")[0] in _OTHER_MODES - {"-m", "--multirun"} for a in argv):  # a run or a sweep
        check_grammar(override_args(argv))
    check_dirs(argv, multirun)
    check_model_source(argv)
    if any(a in _OTHER_MODES or a.split("=")[0] in _OTHER_MODES for a in argv):
        return
    overrides = config_overrides(argv)
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            cfg = compose("config", overrides=overrides)
        validate_run(to_object(cfg))
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        print(f"error: {misplaced(overrides) or one_line(exc)}", file=sys.stderr)
        sys.exit(2)
    except ConfigError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(2)
    _check_run_dir(argv)  # only a valid config gets a directory (Hydra would create it next)
