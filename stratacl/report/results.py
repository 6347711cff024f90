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

Runs are selected explicitly — by directory or glob, `experiment=` (the `+experiment=<name>` a run
was started with), `workload=` and `where=` (config key -> value or predicate) — and a selection
whose runs differ in a config key that no sweep varied (a 32- and a 64-rank sweep, a fixed-shape
run among request-rate runs) is refused with the differing keys named (`mixed="refuse"`), or
labelled (`mixed="label"`). Keys a Hydra multirun swept within one sweep directory, `vary=` keys
and seeds may differ. Every row's `config` column names its values of the differing keys other
than `vary` (the keys the caller draws along, e.g. the x axis): one label per configuration.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from omegaconf import OmegaConf

log = logging.getLogger(__name__)

RUN_COLUMNS = ("run", "run_dir", "overrides", "experiment", "sweep", "config", "workload", "fabric", "baseline",
               "seed", "library")
# config keys that never make runs incomparable: replicates, bookkeeping, display-only values
NEUTRAL = ("seed", "resume", "output.", "limits.", "reference.", "workload.cache_dir", "hydra.")


class MixedRunsError(ValueError):
    """Runs selected together differ in config keys no sweep varied."""
# What a metric name means changes now and then (moe `*_busbw_GBps`: DeepEP's logical GB/s until
# version 2, nccl-tests busbw since): runs of different versions differ in `harness.metrics_version`
# and are refused together like any other config difference. Bump it with a note here when a
# metric keeps its name but changes meaning. Runs from before the field read as version 1.
METRICS_VERSION = 2
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
    varying: list[str] = field(default_factory=list)  # config keys whose value differs between runs
    mixed: list[str] = field(default_factory=list)  # ... of those, the ones no sweep varied

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
        vary = f", varying {self.varying}" if self.varying else ""
        mixed = f", MIXED {self.mixed} (labelled in `config`)" if self.mixed else ""
        return (f"Runs({n} runs, {len(self.summary)} run×library rows, {len(self.results)} result rows, "
                f"{len(self.skipped)} skipped without summary.json{vary}{mixed})")


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


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, object]:
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


def read_config(run_dir: Path) -> dict[str, Any]:
    """The resolved config of a run (`.hydra/config.yaml`), as plain containers; {} if absent."""
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    # resolve=False: the file holds already-resolved values; nothing is interpolated again
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)  # type: ignore[return-value]


def _override_list(run_dir: Path) -> list[str]:
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    return [str(o) for o in yaml.safe_load(path.read_text()) or []]


def _overrides(run_dir: Path) -> str:
    return ",".join(_override_list(run_dir))


def experiment_of(run_dir: Path) -> str | None:
    """The named experiment a run was started with (`+experiment=<name>`), else None."""
    for ov in _override_list(run_dir):
        key, _, value = ov.partition("=")
        if key.lstrip("+~") == "experiment":
            return value
    return None


def sweep_of(run_dir: Path) -> str:
    """The sweep a run belongs to: its multirun's sweep directory, else the run itself."""
    path = run_dir / ".hydra" / "hydra.yaml"
    if path.is_file():
        hc = (yaml.safe_load(path.read_text()) or {}).get("hydra", {})
        if str(hc.get("mode", "")).endswith("MULTIRUN"):
            return str(run_dir.parent)
    return str(run_dir)


def load_run(run_dir: Path, run_id: str) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    """Summary rows (one per library) and result rows of one finished run."""
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = read_config(run_dir)
    lib_cfgs = cfg.get("library", {}) or {}
    flat = flatten(cfg)
    run_cols = {"run": run_id, "run_dir": str(run_dir), "overrides": _overrides(run_dir),
                "experiment": experiment_of(run_dir), "sweep": sweep_of(run_dir), "workload": summary.get("workload"), "fabric": summary.get("fabric"),
                "baseline": summary.get("baseline"), "seed": summary.get("seed", flat.get("seed")),
                "harness.metrics_version": summary.get("metrics_version", 1)}
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


def load_runs(paths_or_globs: str | Path | Iterable[str | Path] = "runs", *, experiment: str | None = None,
              workload: str | None = None, where: Mapping[str, object] | None = None,
              vary: Iterable[str] = (), mixed: str = "refuse") -> Runs:
    """Load the finished runs below `paths_or_globs` (directories, globs or summary.json files)
    that match the selection; refuse (`mixed="refuse"`), label (`"label"`) or allow (`"allow"`) a
    selection whose runs differ in config keys no sweep varied (see the module docstring)."""
    if mixed not in ("refuse", "label", "allow"):
        raise ValueError(f"mixed='{mixed}': use 'refuse', 'label' or 'allow'")
    roots = expand(paths_or_globs)
    done, skipped = find_run_dirs(roots)
    rows: list[dict[str, Any]] = []
    frames: list[pd.DataFrame] = []
    for run_dir in done:
        if experiment is not None and experiment_of(run_dir) != experiment:
            continue
        run_rows, results = load_run(run_dir, _relative_id(run_dir, roots))
        if workload is not None and run_rows and run_rows[0]["workload"] != workload:
            continue
        if where and run_rows and not _matches(run_rows[0], where):
            continue
        rows.extend(run_rows)
        if not results.empty:
            frames.append(results)
    if skipped:
        log.warning("loaded %d runs; skipped %d without summary.json (failed or unfinished): %s",
                    len(done), len(skipped), ", ".join(str(p) for p in skipped[:5])
                    + (" …" if len(skipped) > 5 else ""))
    summary = pd.DataFrame(rows)
    results = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    varying, mixed_keys = differing_keys(summary, vary)
    if mixed_keys and mixed == "refuse":
        raise MixedRunsError(_mixed_message(summary, mixed_keys))
    if not summary.empty:
        label = _labels(summary, [k for k in varying if k not in set(vary)])
        summary["config"] = summary["run"].map(label)
        if not results.empty:
            results = pd.concat([results["run"].map(label).rename("config"), results], axis=1)
        first = [c for c in RUN_COLUMNS if c in summary.columns]  # run columns, metrics, config
        summary = summary[first + [c for c in summary.columns if c not in first]]
    return Runs(summary=summary, results=results, skipped=skipped, varying=varying,
                mixed=mixed_keys if mixed != "allow" else [])


def _matches(row: Mapping[str, object], where: Mapping[str, object]) -> bool:
    for key, want in where.items():
        if key not in row:
            return False
        have = row[key]
        if callable(want):
            if not want(have):
                return False
        elif have != want and str(have) != str(want):
            return False
    return True


def _config_columns(summary: pd.DataFrame) -> list[str]:
    return [c for c in summary.columns
            if ("." in c or c in ("workload", "fabric", "baseline")) and not c.startswith((*NEUTRAL, "lib."))
            and c not in RUN_COLUMNS[:6]]


def _distinct(values: pd.Series) -> int:
    return values.dropna().map(repr).nunique()


def differing_keys(summary: pd.DataFrame, vary: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """(keys whose value differs between the runs, those of them no sweep varied and not in
    `vary`). A key set in some runs only (another workload's or library's knobs) differs only
    where it is set; library knobs compare as `library.<name>.<knob>`."""
    if summary.empty or summary["run"].nunique() < 2:
        return [], []
    per_run = summary.drop_duplicates("run")
    varying = [c for c in _config_columns(summary) if _distinct(per_run[c]) > 1]
    swept = set(vary)
    for _, group in per_run.groupby("sweep"):
        if len(group) > 1:
            swept.update(c for c in varying if _distinct(group[c]) > 1)
    return varying, [c for c in varying if c not in swept]


def _labels(summary: pd.DataFrame, keys: list[str]) -> dict[str, str]:
    """run -> "key=value, ..." over `keys`."""
    per_run = summary.drop_duplicates("run").set_index("run")
    return {str(run): ", ".join(f"{k}={row[k]}" for k in keys) for run, row in per_run.iterrows()}


def _mixed_message(summary: pd.DataFrame, keys: list[str]) -> str:
    per_run = summary.drop_duplicates("run")
    shown = []
    for k in keys[:8]:
        vals = sorted({repr(v) for v in per_run[k].dropna()})
        shown.append(f"{k} ({', '.join(vals[:4])}{' …' if len(vals) > 4 else ''})")
    return (f"the {per_run['run'].nunique()} selected runs differ in config keys no sweep varied: "
            f"{'; '.join(shown)}{' …' if len(keys) > 8 else ''} — fix: select runs explicitly "
            f"(a sweep directory, experiment=..., where={{key: value}}), pass vary=[keys] if the difference "
            f"is meant, or mixed='label' to keep them apart in the `config` column")


def _relative_id(run_dir: Path, roots: list[Path]) -> str:
    """Run id: path below the root it was found under (the dir name for a run given directly);
    with several roots, below their common parent, so runs of two sweeps never share an id."""
    if len(roots) > 1:
        common = Path(os.path.commonpath([str(r) for r in roots]))
        if run_dir != common and run_dir.is_relative_to(common):
            return str(run_dir.relative_to(common))
    for root in sorted(roots, key=lambda r: -len(r.parts)):
        if run_dir == root:
            return run_dir.name
        if run_dir.is_relative_to(root):
            return str(run_dir.relative_to(root))
    return str(run_dir)
