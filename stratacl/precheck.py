"""Compose-time errors as one line: the CLI composes a single run's config once before Hydra does.

Hydra reports a bad override (wrong type, unknown enum value, unknown preset) as a multi-line
message with exit code 1, and lists schema nodes (`*_schema`) among the options. A single run
(not `--multirun`, `--cfg`, `--help`) is composed here first with the same overrides and checked
with `validate_run` (ranges, cross-field meaning); a failure becomes `error: config field '<key>':
<problem> — fix: <options>` and exit code 2, before Hydra creates the run directory, so a bad
config writes nothing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from stratacl.config import RENAMED_KNOBS, to_object, validate_run
from stratacl.errors import ConfigError

CONF = Path(__file__).resolve().parents[1] / "conf"
# flags after which Hydra does something other than one run (sweeps, printing, help)
_OTHER_MODES = {"-m", "--multirun", "-c", "--cfg", "-h", "--help", "--hydra-help", "-i", "--info",
                "--shell-completion", "-sc", "-cp", "--config-path", "-cn", "--config-name", "-cd",
                "--config-dir", "-p", "--package", "--experimental-rerun"}


def options(group: str) -> list[str]:
    """The user-facing choices of a config group (schema nodes left out)."""
    d = CONF / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def one_line(exc: BaseException) -> str:
    """`config field '<key>': <problem> — fix: <hint>` from a Hydra/OmegaConf composition error."""
    parts, e = [], exc
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


def _check_run_dir(argv: list[str]) -> None:
    """Hydra creates the run directory before any of our code runs: an unwritable one would end in
    its traceback, so try it first."""
    for a in argv:
        key, _, value = a.partition("=")
        if key.lstrip("+") == "hydra.run.dir" and value:
            try:
                Path(value).mkdir(parents=True, exist_ok=True)
                probe = Path(value) / ".write_probe"
                probe.touch()
                probe.unlink()
            except OSError as exc:
                print(f"error: config field 'hydra.run.dir': cannot write '{value}': {exc.strerror or exc} "
                      "— fix: a writable directory", file=sys.stderr)
                sys.exit(2)


def precheck(argv: list[str]) -> None:
    """Compose a single run's config; exit 2 with one line if Hydra would refuse it."""
    if any(a in _OTHER_MODES or a.split("=")[0] in _OTHER_MODES for a in argv):
        return
    overrides = [a for a in argv if not a.startswith("-") and not a.lstrip("+~").startswith("hydra")]
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            cfg = compose("config", overrides=overrides)
        validate_run(to_object(cfg))
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        sys.exit(2)
    except ConfigError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(2)
    _check_run_dir(argv)  # only a valid config gets a directory (Hydra would create it next)
