"""Shared plumbing of the analysis notebooks: where runs and figures live, finding the runs a
notebook needs and, when there are none, simulating a small configuration first.

Environment:
- `STRATACL_RUNS`: root searched for runs (default `runs/`);
- `STRATACL_FIGURES`: where PNGs go (default `analysis/figures/`);
- `STRATACL_NB_TINY=1`: the "no runs" path uses tiny configurations (the notebook tests).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # this checkout's stratacl, whatever copy is pip-installed

from stratacl.results import Runs, load_runs  # noqa: E402

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


def select(root: Path, workload: str, keep: RunFilter | None = None) -> Runs | None:
    """Runs of `workload` below `root` that pass `keep` (None when there are none)."""
    if not root.exists() or not any(root.rglob("summary.json")):
        return None
    runs = load_runs(root)
    if runs.summary.empty:
        return None
    s = runs.summary[runs.summary["workload"] == workload]
    if keep is not None:
        s = s[s["run"].isin([run for run, rows in s.groupby("run") if keep(rows)])]
    if s.empty:
        return None
    results = runs.results
    if not results.empty:
        results = results[results["run"].isin(s["run"].unique())].reset_index(drop=True)
    return Runs(summary=s.reset_index(drop=True), results=results, skipped=runs.skipped)


def simulate(name: str, args: Sequence[str], multirun: bool = False) -> Path:
    """Run `python -m stratacl.run` into a fresh temporary directory; returns it."""
    tmp = Path(tempfile.mkdtemp(prefix=f"stratacl-{name}-"))
    # sweep points in numbered subdirs: override-named ones overflow the file-name limit
    where = [f"hydra.sweep.dir={tmp / name}", "hydra.sweep.subdir=${hydra.job.num}"] if multirun else \
        [f"hydra.run.dir={tmp / name}"]
    cmd = [sys.executable, "-m", "stratacl.run", *(["--multirun"] if multirun else []), *args, *QUIET, *where]
    print("simulating:", " ".join(cmd[2:]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(cmd, check=True, cwd=tmp, env=env, stdout=subprocess.DEVNULL)
    return tmp


def runs_for(name: str, workload: str, args: Sequence[str], keep: RunFilter | None = None,
             multirun: bool = False) -> Runs:
    """The matching runs under RUNS, else those of a fresh small simulation with `args`."""
    runs = select(RUNS, workload, keep)
    if runs is None:
        runs = select(simulate(name, args, multirun), workload, keep)
        assert runs is not None, f"the small '{name}' run wrote no matching summary.json"
    print(runs)
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
