"""Resuming interrupted sweeps: a job whose output directory already holds `summary.json` is done.

The CLI writes `summary.json` last and atomically (docs/architecture.md), so its presence is a reliable
"this point finished" marker. Rerunning a multirun with the same `hydra.sweep.dir` and
`resume=true` makes every finished point return at once (Hydra still launches it and refreshes
its `.hydra/` files, but nothing is simulated or rewritten); failed, killed or never-started
points run normally. The sweep subdir is `${hydra.job.override_dirname}`, so a point is the same
directory exactly when its overrides are the same.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

MARKER = "summary.json"


def is_finished(out_dir: Path) -> bool:
    return (Path(out_dir) / MARKER).is_file()


def skip_finished(out_dir: Path, resume: bool) -> bool:
    """True (and says so) when `resume` is on and the job in `out_dir` already finished."""
    if resume and is_finished(out_dir):
        print(f"skipped (done): {out_dir}")
        return True
    return False


class RememberSweepDir(Callback):
    """Hydra callback (conf/config.yaml `hydra.callbacks`): keeps the resolved sweep directory in
    the driver, so an interrupted sweep can name it in its resume command."""

    sweep_dir: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        RememberSweepDir.sweep_dir = str(config.hydra.sweep.dir)  # resolves ${now:...} once, cached


def resume_command(argv: list[str], sweep_dir: str | None) -> str:
    """The command that finishes an interrupted sweep: the same arguments, the sweep's directory
    and resume=true (replacing any hydra.sweep.dir / resume the user gave)."""
    keep = [a for a in argv if a.partition("=")[0].lstrip("+") not in ("hydra.sweep.dir", "resume")]
    tail = ([f"hydra.sweep.dir={sweep_dir}"] if sweep_dir else []) + ["resume=true"]
    return shlex.join(["python", "-m", "stratacl.run", *keep, *tail])
