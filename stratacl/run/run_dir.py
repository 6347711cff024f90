"""A fresh default run directory per run: the default `hydra.run.dir` names a run by its second and
workload, so two runs started in the same second (a script, two terminals) would share one directory
and the second would overwrite the first's results. The `fresh_dir` resolver claims the directory
atomically (mkdir fails if it exists) and falls back to `<dir>_2`, `<dir>_3`, ..."""

from __future__ import annotations

import functools
import os

from omegaconf import OmegaConf


@functools.cache  # Hydra reads hydra.run.dir more than once per run: one claim, one answer
def fresh_dir(base: str) -> str:
    parent = os.path.dirname(base)
    if parent:
        os.makedirs(parent, exist_ok=True)
    for n in range(1, 10_000):
        path = base if n == 1 else f"{base}_{n}"
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{base}: 10,000 run directories claimed in one second")


def register() -> None:
    OmegaConf.register_new_resolver("fresh_dir", fresh_dir, replace=True)
