"""Resuming interrupted sweeps: a job whose output directory already holds `summary.json` is done.

The CLI writes `summary.json` last and atomically (docs/architecture.md), so its presence is a reliable
"this point finished" marker. Rerunning a multirun with the same `hydra.sweep.dir` and
`resume=true` makes every finished point return at once (Hydra still launches it and refreshes
its `.hydra/` files, but nothing is simulated or rewritten); failed, killed or never-started
points run normally. The sweep subdir is `${hydra.job.override_dirname}`, so a point is the same
directory exactly when its overrides are the same.
"""

from __future__ import annotations

from pathlib import Path

MARKER = "summary.json"


def is_finished(out_dir: Path) -> bool:
    return (Path(out_dir) / MARKER).is_file()


def skip_finished(out_dir: Path, resume: bool) -> bool:
    """True (and says so) when `resume` is on and the job in `out_dir` already finished."""
    if resume and is_finished(out_dir):
        print(f"skipped (done): {out_dir}")
        return True
    return False


def sweep_status(sweep_dir: Path) -> tuple[list[Path], list[Path]]:
    """(finished, unfinished) point directories of a sweep: a point counts once Hydra created its
    `.hydra/` directory; unfinished ones are what `resume=true` will run again."""
    started = sorted(p.parent for p in Path(sweep_dir).glob("**/.hydra"))
    return [p for p in started if is_finished(p)], [p for p in started if not is_finished(p)]
