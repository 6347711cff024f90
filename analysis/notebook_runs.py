"""Shared plumbing of the analysis notebooks: where runs and figures live, finding the runs a
notebook needs and, when there are none, simulating a small configuration first.

Which runs a notebook reads is explicit: its named experiment (`+experiment=<name>`) under the
runs root, or what the command line names —

    python analysis/inference.py --run               # run the notebook's experiment first, read only that
    python analysis/inference.py --runs runs/multirun/2026-12-01/10-00-00   # read this sweep directory
    python analysis/operators.py --where workload.ranks=64                  # config filter (repeatable)
    python analysis/operators.py --experiment scaling                       # another named experiment

Runs that differ in a config key no sweep varied are refused with the keys named (or, for
notebooks that can draw them apart, labelled per configuration): see `stratacl.report.results.load_runs`.

Environment:
- `STRATACL_RUNS`: root searched for runs (default `runs/`);
- `STRATACL_RUN=1`: as `--run`;
- `STRATACL_FIGURES`: where PNGs go (default `analysis/figures/`);
- `STRATACL_NB_TINY=1`: the "no runs" path uses tiny configurations (the notebook tests).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # this checkout's stratacl, whatever copy is pip-installed

from stratacl.report.results import MixedRunsError, Runs, load_runs  # noqa: E402

RUNS = Path(os.environ.get("STRATACL_RUNS", REPO / "runs"))
FIGURES = Path(os.environ.get("STRATACL_FIGURES", HERE / "figures"))
TINY = os.environ.get("STRATACL_NB_TINY", "") == "1"
MODEL_CACHE = REPO / "runs" / ".cache" / "modelcost"  # shared disk cache of measured model costs

# A DeepSeek-V3-shaped model small enough to cost in seconds (same as tests/test_llm_infer.py), on
# 4-die instances: the serving mechanisms are those of the full model.
TINY_INFER = [
    "workload.model.preset=deepseek_v3",
    "+workload.model.overrides={num_hidden_layers:3,first_k_dense_replace:1,hidden_size:256,"
    "intermediate_size:512,moe_intermediate_size:128,n_routed_experts:16,num_experts_per_tok:4,n_group:1,"
    "topk_group:1,num_attention_heads:4,num_key_value_heads:4,kv_lora_rank:64,q_lora_rank:64,"
    "qk_rope_head_dim:16,qk_nope_head_dim:32,v_head_dim:32,vocab_size:1024}",
    "workload.layout.prefill_instances=1", "workload.layout.prefill_dp=4", "workload.layout.prefill_ep=4",
    "workload.layout.decode_instances=1", "workload.layout.decode_dp=4", "workload.layout.decode_ep=4",
    "workload.requests.duration_s=8", "workload.warmup_s=1", "workload.cache_dir=",
    "workload.capacity.saturation=false",
]
# DeepSeek-V4-Flash at its paper layout, over a shorter arrival window than the 60 s default.
SMALL_INFER = ["workload.requests.duration_s=20", "workload.warmup_s=5", f"workload.cache_dir={MODEL_CACHE}"]
# llm_train at 16 dies (tests/test_llm_train_cli.py): the default 512-die layout takes minutes.
SMALL_TRAIN = ["workload.num_layers=4", "workload.dies=16", "workload.fsdp=4", "workload.ep=8",
               "workload.global_batch=4", "workload.seq_len=512"]
QUIET = ["output.timeline=false", "output.progress=false"]

RunFilter = Callable[[pd.DataFrame], bool]  # one run's summary rows -> keep the run?


def options(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The notebook's selection flags (unknown arguments, e.g. a Jupyter kernel's, are ignored)."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--run", action="store_true", help="run the notebook's experiment first and read only it")
    ap.add_argument("--runs", action="append", type=Path, help="read these run or sweep directories")
    ap.add_argument("--experiment", help="read the runs of this named experiment")
    ap.add_argument("--where", action="append", default=[], help="config filter key=value")
    opts, _ = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    opts.run = opts.run or os.environ.get("STRATACL_RUN", "") == "1"
    return opts


def _value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def experiment_of(args: Sequence[str]) -> str | None:
    return next((a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("experiment=")), None)


def select(roots: Sequence[Path], workload: str, keep: RunFilter | None = None, *, experiment: str | None = None,
           where: dict | None = None, vary: Sequence[str] = (), mixed: str = "refuse") -> Runs | None:
    """Runs of `workload` (of `experiment`, matching `where`) below `roots` that pass `keep`
    (None when there are none); a mixed selection raises MixedRunsError (`mixed="refuse"`)."""
    roots = [r for r in roots if r.exists() and any(r.rglob("summary.json"))]
    if not roots:
        return None
    runs = load_runs(roots, experiment=experiment, workload=workload, where=where, vary=vary, mixed="allow")
    s = runs.summary
    if s.empty:
        return None
    if keep is not None:
        s = s[s["run"].isin([run for run, rows in s.groupby("run") if keep(rows)])]
    if s.empty:
        return None
    dirs = list(dict.fromkeys(Path(d) for d in s["run_dir"]))
    return load_runs(dirs, vary=vary, mixed=mixed)  # the mixed check on exactly the kept runs


def simulate(name: str, args: Sequence[str], multirun: bool = False, root: Path | None = None) -> Path:
    """Run `python -m stratacl.run` into a fresh directory (temporary, or under `root`); returns it."""
    if root is None:
        tmp = Path(tempfile.mkdtemp(prefix=f"stratacl-{name}-"))
    else:
        tmp = root / "notebooks" / time.strftime("%Y-%m-%d_%H-%M-%S")
        tmp.mkdir(parents=True, exist_ok=True)
    # sweep points in numbered subdirs: override-named ones overflow the file-name limit
    where = [f"hydra.sweep.dir={tmp / name}", "hydra.sweep.subdir=${hydra.job.num}"] if multirun else \
        [f"hydra.run.dir={tmp / name}"]
    cmd = [sys.executable, "-m", "stratacl.run", *(["--multirun"] if multirun else []), *args, *QUIET, *where]
    print("simulating:", " ".join(cmd[2:]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(cmd, check=True, cwd=tmp, env=env, stdout=subprocess.DEVNULL)
    return tmp / name


def runs_for(name: str, workload: str, args: Sequence[str], keep: RunFilter | None = None,
             multirun: bool = False, vary: Sequence[str] = (), mixed: str = "refuse") -> Runs:
    """The runs this notebook reads: with `--run`, a fresh run of `args` (its experiment) under
    RUNS; with `--runs`, those directories; else the runs of the experiment named in `args` under
    RUNS, and when there are none a fresh small simulation with `args`. A selection mixing
    configurations is refused (exit 2, the differing keys named) unless `mixed="label"`."""
    opts = options()
    experiment = opts.experiment or experiment_of(args)
    where = dict(w.split("=", 1) for w in opts.where) or None
    where = {k: _value(v) for k, v in where.items()} if where else None
    try:
        if opts.run:
            runs = select([simulate(name, args, multirun, root=RUNS)], workload, keep, vary=vary, mixed=mixed)
        else:
            roots = list(opts.runs or [RUNS])
            runs = select(roots, workload, keep, experiment=None if opts.runs else experiment, where=where,
                          vary=vary, mixed=mixed)
            if runs is None and opts.runs:
                sys.exit(f"analysis/{name}: no {workload} run in {[str(r) for r in roots]} matches the selection")
            if runs is None:
                of = f" of experiment '{experiment}'" if experiment else ""
                print(f"no {workload} run{of} under {RUNS}: running a small one (--runs DIR reads others)")
                runs = select([simulate(name, args, multirun)], workload, keep, vary=vary, mixed=mixed)
    except MixedRunsError as exc:
        print(f"analysis/{name}: refused: {exc} (from the command line: --runs DIR, --experiment NAME, "
              f"--where key=value)", file=sys.stderr)
        sys.exit(2)
    assert runs is not None, f"the small '{name}' run wrote no matching summary.json"
    print(runs)
    print(f"selected: workload {workload}, experiment {sorted(set(runs.summary['experiment'].dropna())) or 'none'},"
          f" from {sorted(set(runs.summary['sweep']))[:3]}")
    return runs


def has_libraries(*libs: str) -> RunFilter:
    return lambda rows: set(libs) <= set(rows["library"])


def extra_table(runs: Runs, name: str) -> pd.DataFrame:
    """A workload's extra table (`<name>.parquet`, e.g. iterations) of every run, with `run` and the
    run's swept config columns joined (its rows carry their own `library`)."""
    frames = []
    config = [c for c in runs.summary.columns if "." in c and not c.startswith("lib.")]
    for run, rows in runs.summary.groupby("run", sort=False):
        path = Path(rows["run_dir"].iloc[0]) / f"{name}.parquet"
        if path.is_file():
            frame = pd.read_parquet(path)
            first = rows.iloc[0]
            cols = {"run": [run] * len(frame), **{c: [first[c]] * len(frame) for c in config if c not in frame}}
            frames.append(pd.concat([pd.DataFrame(cols, index=frame.index), frame], axis=1))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def save(fig: Figure, name: str) -> Path:
    FIGURES.mkdir(parents=True, exist_ok=True)
    path = FIGURES / f"{name}.png"
    fig.savefig(path, dpi=150, bbox_inches="tight")
    print("figure:", path)
    return path
