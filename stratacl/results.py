"""Load run directories into tidy pandas frames (docs/architecture.md → analysis/).

`load_runs("runs/multirun/2026-*")` finds every run below the given paths by its `summary.json`
(single runs and multirun sweep points alike), reads the resolved config Hydra stored in
`.hydra/config.yaml` and flattens it into dotted columns, so sweeps are analysed with plain
pandas::

    runs = load_runs("runs/multirun")
    runs.summary.groupby(["library", "workload.ranks"])["busbw_GBps_mean"].mean()
    runs.results.query("collective == 'allgather'")

Directories that have a `.hydra/config.yaml` but no `summary.json` are failed or unfinished runs
(the CLI writes `summary.json` last): they are skipped, counted in `Runs.skipped` and reported.
"""

from __future__ import annotations

import glob
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

log = logging.getLogger(__name__)

RUN_COLUMNS = ("run", "run_dir", "overrides", "workload", "fabric", "baseline", "seed", "library")
RATIO_SUFFIX = "_ratio"  # summary column `<metric>_ratio` = metric / baseline's metric


@dataclass
class Runs:
    """Frames of a set of runs.

    summary: one row per (run, library); metrics as columns, `<metric>_ratio` vs the baseline,
        the run's flattened config (`workload.ranks`, `fabric.tiers.node.beta_GBps`, …) and the
        row library's own knobs as `lib.<knob>` (so ablation ladders group by `lib.data_path`).
    results: every run's `results.parquet` rows with the run's flattened config joined.
    skipped: run directories without `summary.json` (failed or interrupted runs).
    """

    summary: pd.DataFrame
    results: pd.DataFrame
    skipped: list[Path] = field(default_factory=list)

    @property
    def metrics(self) -> list[str]:
        """Metric columns of `summary` (without their ratio twins)."""
        return [c for c in self.summary.columns if f"{c}{RATIO_SUFFIX}" in self.summary.columns]

    def long(self) -> pd.DataFrame:
        """One row per (run, library, metric) with `value` and `ratio` (for seaborn-style plots)."""
        if self.summary.empty:
            return pd.DataFrame(columns=["run", "library", "metric", "value", "ratio"])
        ids = [c for c in self.summary.columns if c not in self.metrics and not c.endswith(RATIO_SUFFIX)]
        value = self.summary.melt(id_vars=ids, value_vars=self.metrics, var_name="metric")
        ratio = self.summary.melt(id_vars=["run", "library"],
                                  value_vars=[f"{m}{RATIO_SUFFIX}" for m in self.metrics],
                                  var_name="metric", value_name="ratio")
        ratio["metric"] = ratio["metric"].str.removesuffix(RATIO_SUFFIX)
        return value.merge(ratio, on=["run", "library", "metric"], how="left")

    def __repr__(self) -> str:
        n = self.summary["run"].nunique() if not self.summary.empty else 0
        return (f"Runs({n} runs, {len(self.summary)} run×library rows, {len(self.results)} result rows, "
                f"{len(self.skipped)} skipped without summary.json)")


def expand(paths_or_globs: str | Path | Iterable[str | Path]) -> list[Path]:
    """Existing directories named by paths or globs (a file stands for its directory)."""
    items = [paths_or_globs] if isinstance(paths_or_globs, str | Path) else list(paths_or_globs)
    roots: list[Path] = []
    for item in items:
        matches = glob.glob(str(item), recursive=True)
        if not matches:
            raise FileNotFoundError(f"no run directory or file matches '{item}'")
        for match in map(Path, matches):
            roots.append((match.parent if match.is_file() else match).resolve())
    return sorted(set(roots))


def find_run_dirs(roots: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """(finished, skipped) run directories below `roots`: finished ones hold summary.json, skipped
    ones only Hydra's `.hydra/config.yaml` (the job started but never succeeded)."""
    done: set[Path] = set()
    started: set[Path] = set()
    for root in roots:
        done.update(p.parent.resolve() for p in root.rglob("summary.json"))
        started.update(p.parent.parent.resolve() for p in root.rglob(".hydra/config.yaml"))
    return sorted(done), sorted(started - done)


def flatten(cfg: Mapping, prefix: str = "") -> dict[str, object]:
    """Nested mapping -> {"a.b.c": value}; lists become tuples so columns stay hashable."""
    out: dict[str, object] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, list):
            out[name] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        else:
            out[name] = value
    return out


def read_config(run_dir: Path) -> dict:
    """The resolved config of a run (`.hydra/config.yaml`), as plain containers; {} if absent."""
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    # resolve=False: the file holds already-resolved values; nothing is interpolated again
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)  # type: ignore[return-value]


def _overrides(run_dir: Path) -> str:
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return ""
    return ",".join(str(o) for o in OmegaConf.to_container(OmegaConf.load(path)) or [])


def load_run(run_dir: Path, run_id: str) -> tuple[list[dict], pd.DataFrame]:
    """Summary rows (one per library) and result rows of one finished run."""
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = read_config(run_dir)
    lib_cfgs = cfg.get("library", {}) or {}
    flat = flatten(cfg)
    run_cols = {"run": run_id, "run_dir": str(run_dir), "overrides": _overrides(run_dir),
                "workload": summary.get("workload"), "fabric": summary.get("fabric"),
                "baseline": summary.get("baseline"), "seed": summary.get("seed", flat.get("seed"))}
    rows = []
    for lib, metrics in summary.get("libraries", {}).items():
        row: dict[str, object] = {**run_cols, "library": lib, **metrics}
        for metric, ratio in summary.get("ratios", {}).get(lib, {}).items():
            row[f"{metric}{RATIO_SUFFIX}"] = ratio
        row.update({f"lib.{k}": v for k, v in flatten(lib_cfgs.get(lib, {}) or {}).items()})
        row.update({k: v for k, v in flat.items() if k not in row})
        rows.append(row)
    results = pd.DataFrame()
    parquet = run_dir / "results.parquet"
    if parquet.is_file():
        results = pd.read_parquet(parquet)
        extra = {k: v for k, v in {**run_cols, **flat}.items()
                 if k not in results.columns and k != "library"}
        # broadcast run-level columns in one concat (no per-column inserts: frames stay unfragmented)
        results = pd.concat([pd.DataFrame({k: [v] * len(results) for k, v in extra.items()},
                                          index=results.index), results], axis=1)
    return rows, results


def load_runs(paths_or_globs: str | Path | Iterable[str | Path] = "runs") -> Runs:
    """Load every finished run below `paths_or_globs` (directories, globs or summary.json files)."""
    roots = expand(paths_or_globs)
    done, skipped = find_run_dirs(roots)
    rows: list[dict] = []
    frames: list[pd.DataFrame] = []
    for run_dir in done:
        run_rows, results = load_run(run_dir, _relative_id(run_dir, roots))
        rows.extend(run_rows)
        if not results.empty:
            frames.append(results)
    if skipped:
        log.warning("loaded %d runs; skipped %d without summary.json (failed or unfinished): %s",
                    len(done), len(skipped), ", ".join(str(p) for p in skipped[:5])
                    + (" …" if len(skipped) > 5 else ""))
    summary = pd.DataFrame(rows)
    if not summary.empty:  # run columns first, then metrics and ratios, then config
        first = [c for c in RUN_COLUMNS if c in summary.columns]
        summary = summary[first + [c for c in summary.columns if c not in first]]
    results = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return Runs(summary=summary, results=results, skipped=skipped)


def _relative_id(run_dir: Path, roots: list[Path]) -> str:
    """Run id: path below the root it was found under (the dir name for a run given directly)."""
    for root in sorted(roots, key=lambda r: -len(r.parts)):
        if run_dir == root:
            return run_dir.name
        if run_dir.is_relative_to(root):
            return str(run_dir.relative_to(root))
    return str(run_dir)
