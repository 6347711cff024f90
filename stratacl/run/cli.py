"""CLI: `python -m stratacl.run workload=<name> [overrides]` (docs/architecture.md).

Composes the Hydra config, validates it, runs the workload once per selected library on the same
trace and seed, prints a side-by-side table and writes the run directory: summary.json,
results.parquet and timeline.json. A failed run prints one message, exits non-zero and leaves no
summary.json behind.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import hydra
import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from stratacl import limits, workload_registry
from stratacl.comm.library import LibraryModel
from stratacl.compare import ratios
from stratacl.config import RunConfig, moved_preset_notes, to_object, validate_run
from stratacl.engine.replay import simulate
from stratacl.errors import ConfigError, HarnessError
from stratacl.machine.fabric import Fabric
from stratacl.paths import CONF
from stratacl.progress import Progress
from stratacl.report.results import METRICS_VERSION
from stratacl.report.text import report_lines
from stratacl.report.timeline import interval_timeline, write_timeline
from stratacl.report.verdict import accounting, merge_accounting, verdict
from stratacl.run.precheck import one_line as precheck_one_line
from stratacl.run.precheck import precheck
from stratacl.run.run_dir import register as register_run_dir
from stratacl.run.sweep_resume import RememberSweepDir, resume_command, skip_finished
from stratacl.run_traces import TRACES_DIR, TraceRecorder
from stratacl.workload_api import RunContext, WorkloadResult

register_run_dir()  # before Hydra resolves hydra.run.dir, in the CLI and in launcher workers
log = logging.getLogger("stratacl")

OUTPUTS = ("summary.json", "results.parquet", "timeline.json", "run_timeline.json", "utilisation.parquet")


def size_check(cfg: RunConfig) -> None:
    """Refuse a run whose estimated size exceeds `limits` (the workload's `estimate(cfg)`)."""
    estimate = workload_registry.spec(cfg.workload.name).estimate()
    if estimate is not None:
        limits.check(estimate(cfg.workload), cfg.limits, len(cfg.library))


def execute(cfg: RunConfig, out_dir: Path, echo: bool = True) -> dict[str, Any]:
    """Run a composed config and write the run directory. Returns the summary dict."""
    t0 = time.perf_counter()
    validate_run(cfg)
    fabric = Fabric(cfg.fabric)
    libraries = {name: LibraryModel(name, lib, fabric) for name, lib in cfg.library.items()}
    workload = workload_registry.spec(cfg.workload.name).run()
    size_check(cfg)
    log.info("run: workload %s, fabric %s (%d dies), libraries %s (baseline %s), seed %d, into %s",
             cfg.workload.name, fabric.name, fabric.world, list(libraries), cfg.baseline, cfg.seed, out_dir)
    progress = Progress(cfg.workload.name, enabled=cfg.output.progress)
    ctx = RunContext(cfg=cfg, fabric=fabric, libraries=libraries, baseline=cfg.baseline,
                     seed=cfg.seed, progress=progress,
                     recorder=TraceRecorder(out_dir) if cfg.output.trace else None)
    try:
        result = workload(ctx)
    except BaseException:
        progress.close(failed=True)
        raise
    progress.close()
    result.notes[:0] = moved_preset_notes(cfg.library, cfg.fabric)
    for note in result.notes:
        log.info("note: %s", note)
    summary = {
        "workload": cfg.workload.name,
        "fabric": fabric.name,
        "baseline": cfg.baseline,
        "seed": cfg.seed,
        "metrics_version": METRICS_VERSION,  # stratacl/report/results.py: a metric name's meaning
        "libraries": _strict(result.metrics),
        "ratios": ratios(result.metrics, cfg.baseline),
    }
    accounted = accounting(result.rows, result.extra_rows)  # the report's mechanisms (verdict.py)
    summary["verdict"] = verdict(cfg.workload.name, merge_accounting(summary["libraries"], accounted), cfg.baseline)
    if cfg.output.timeline or cfg.output.utilisation:
        result.timelines = _recorded(result.timelines, libraries)
    _write(out_dir, cfg, result, summary, ctx.recorder)
    log.info("wrote %s in %.1f s", out_dir, time.perf_counter() - t0)
    if echo:
        print("\n".join(report_lines(cfg.workload.name, summary, accounted, cfg.reference, result.table)))
        for note in result.notes:
            print(f"note: {note}")
        print(f"\nrun directory: {out_dir}  ({time.perf_counter() - t0:.1f} s)")
    return summary


def _recorded(timelines: dict[str, Any], libraries: dict[str, LibraryModel]) -> dict[str, Any]:
    """Replay each library's timeline trace once more with the utilisation recorder (a replay is
    deterministic, so only phase intervals and the utilisation series are added)."""
    return {lib: (trace, res if res.phases is not None else simulate(trace, libraries[lib], utilisation=True))
            for lib, (trace, res) in timelines.items()}


def _write(out_dir: Path, cfg: RunConfig, result: WorkloadResult, summary: dict[str, Any],
           recorder: TraceRecorder | None = None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result.rows.to_parquet(out_dir / "results.parquet", index=False)
        for name, frame in result.extra_rows.items():
            frame.to_parquet(out_dir / f"{name}.parquet", index=False)
        if cfg.output.timeline and result.timelines:
            write_timeline(out_dir / "timeline.json", result.timelines, cfg.output.timeline_max_ranks,
                           result.timeline_label)
        if cfg.output.timeline and result.run_timeline is not None:
            (out_dir / "run_timeline.json").write_text(json.dumps(
                interval_timeline(result.run_timeline, result.run_timeline_label)))
        util = [res.utilisation.assign(library=lib) for lib, (_, res) in result.timelines.items()
                if cfg.output.utilisation and res.utilisation is not None]
        if util:
            pd.concat(util, ignore_index=True).to_parquet(out_dir / "utilisation.parquet", index=False)
        if recorder is not None:
            recorder.close()
        tmp = out_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
        os.replace(tmp, out_dir / "summary.json")  # last, atomically: its presence means success
    except BaseException:
        _remove_outputs(out_dir)
        raise


def _remove_outputs(out_dir: Path) -> None:
    for name in (*OUTPUTS, "summary.json.tmp"):
        (out_dir / name).unlink(missing_ok=True)
    for extra in out_dir.glob("*.parquet"):  # workload-specific tables (e.g. iterations.parquet)
        extra.unlink()
    shutil.rmtree(out_dir / TRACES_DIR, ignore_errors=True)  # output.trace


def _remove_bare_run_dir(out_dir: Path) -> None:
    """A failed run's directory holding only what Hydra wrote (its config and the log) goes too:
    a bad value found at run time leaves nothing behind, as one found before the run does."""
    if out_dir.is_dir() and {p.name for p in out_dir.iterdir()} <= {".hydra", "run.log"}:
        shutil.rmtree(out_dir, ignore_errors=True)


def _strict(metrics: dict[str, dict[str, float]]) -> dict[str, dict[str, float | None]]:
    """Strict JSON: an undefined metric (NaN, ±inf) is written as null."""
    return {lib: {k: (float(v) if math.isfinite(float(v)) else None) for k, v in m.items()}
            for lib, m in metrics.items()}


@hydra.main(version_base=None, config_path=str(CONF), config_name="config")  # stratacl/paths.py
def main(dcfg: DictConfig) -> None:
    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    if skip_finished(out_dir, bool(dcfg.get("resume", False))):
        return
    try:
        _check_choices(hc.runtime.choices, list(hc.overrides.task))
        cfg = to_object(dcfg)
        execute(cfg, out_dir)
    except KeyboardInterrupt:
        _remove_outputs(out_dir)
        log.info("interrupted")
        if multirun:  # the driver prints the sweep's one line (resume command); a point stays quiet
            sys.exit(130)
        print("interrupted: nothing written (summary.json absent)", file=sys.stderr)
        sys.exit(130)
    except EXPECTED as exc:
        _remove_outputs(out_dir)
        if multirun:
            raise
        log.info("failed: %s", exc)
        _remove_bare_run_dir(out_dir)
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        sys.exit(2)


def run_overrides(overrides: list[str], out_dir: Path) -> tuple[int, str]:
    """What `python -m stratacl.run <overrides>` does for one run, in process (tests, notebooks):
    (exit code, the one-line error or "")."""
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            dcfg = compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        return 2, f"error: {precheck_one_line(exc)}"
    try:
        execute(to_object(dcfg), out_dir, echo=False)
    except EXPECTED as exc:
        _remove_outputs(out_dir)
        return 2, f"error: {_one_line(exc)}"
    return 0, ""


# Failures a user can cause and fix (a config value, an input file, a directory); anything else
# is a bug and keeps its traceback.
EXPECTED = (HarnessError, OmegaConfBaseException, OSError)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, HarnessError):
        where = f" '{exc.filename}'" if exc.filename else ""
        return f"cannot use{where}: {exc.strerror or exc} — fix: check the path and its permissions"
    return " ".join(str(exc).split())


def _check_choices(choices: dict[str, Any], overrides: list[str]) -> None:
    """What Hydra composes without complaint but cannot be meant: a schema node chosen as a
    workload, the same library twice."""
    wl = str(choices.get("workload", ""))
    if wl.endswith("_schema"):
        raise ConfigError("workload", f"'{wl}' is a schema, not a workload",
                          f"use workload={wl.removesuffix('_schema')}")
    for ov in overrides:
        key, _, value = ov.partition("=")
        if key.lstrip("+~") == "library" and value.startswith("["):
            names = [v.strip() for v in value.strip("[]").split(",") if v.strip()]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ConfigError("library", f"{dup} selected more than once",
                                  "list each library once (override its knobs as library.<name>.<knob>=...)")


def interrupt_outside_finalizers() -> None:
    """Ctrl-C that lands while a finalizer (`__del__`) runs is swallowed by Python, which prints
    "Exception ignored in ..." with a traceback, and the run goes on. Deliver it again instead, so
    that it reaches the run's own handlers (one line, exit 130)."""
    default = sys.unraisablehook

    def hook(unraisable: Any) -> None:  # noqa: ANN401 - sys.UnraisableHookArgs
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            import signal
            import threading

            # from another thread, a moment later: raised once this hook and the finalizer are done
            threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGINT)).start()
            return
        default(unraisable)

    sys.unraisablehook = hook


def cli(argv: list[str]) -> None:
    # conf/hydra/launcher/ray.yaml shares its name with the plugin's schema node, which Hydra 1.3
    # still merges it into (a check we want) with a deprecation notice a user can do nothing about
    warnings.filterwarnings("ignore", message=".*is validated against ConfigStore schema with the same name")
    precheck(argv)
    interrupt_outside_finalizers()
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C of a sweep reaches the driver here (a single run exits in main)
        print(f"interrupted: finished points are kept; resume with: "
              f"{resume_command(argv, RememberSweepDir.sweep_dir)}", file=sys.stderr)
        sys.exit(130)

