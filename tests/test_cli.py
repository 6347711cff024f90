"""The CLI as users run it: run directory, determinism, clear failures, multirun."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from helpers import run_cli

SMALL = ["workload.max_bytes=4194304"]  # keep CLI tests quick: 64 KiB – 4 MiB


def test_default_run_writes_the_run_directory(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli([f"hydra.run.dir={out}", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workload"] == "collectives" and summary["fabric"] == "cloudmatrix384"
    assert summary["baseline"] == "hccl" and list(summary["libraries"]) == ["hccl", "stratacl"]
    assert summary["ratios"]["hccl"]["busbw_GBps_mean"] == pytest.approx(1.0)
    rows = pd.read_parquet(out / "results.parquet")
    assert set(rows["library"]) == {"hccl", "stratacl"}
    assert len(rows) == 2 * 4 * 7  # libraries × collectives × sizes 64 KiB..4 MiB
    # busbw = algbw × nccl-tests factor on every row
    ar = rows[rows["collective"] == "allreduce"]
    assert (ar["busbw_GBps"] / ar["algbw_GBps"]).round(9).eq(round(2 * 31 / 32, 9)).all()
    timeline = json.loads((out / "timeline.json").read_text())
    xs = [e for e in timeline["traceEvents"] if e["ph"] == "X"]
    assert xs and all(e["dur"] >= 0 for e in xs)
    assert (out / ".hydra" / "config.yaml").exists()
    assert "stratacl/hccl" in proc.stdout  # side-by-side table printed
    assert "hccl [GB/s]" in proc.stdout and "stratacl/hccl [×]" in proc.stdout  # with its units


def test_same_seed_gives_byte_identical_summary(tmp_path) -> None:  # noqa: ANN001
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        assert run_cli([f"hydra.run.dir={d}", "seed=7", *SMALL], tmp_path).returncode == 0
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()


@pytest.mark.parametrize("override, field", [
    ("workload.ranks=abc", "workload.ranks"),                       # wrong type (compose time)
    ("fabric.tiers.node.beta_GBps=-5", "fabric.tiers.node.beta_GBps"),  # negative bandwidth
    ("library=[hccl,nosuchlib]", "unknown library 'nosuchlib'"),    # unknown preset
    ("fabric=nosuchfabric", "unknown fabric 'nosuchfabric'"),       # unknown preset
    ("workload.ranks=1000", "workload.ranks"),                      # beyond 768 dies
    ("workload.group_size=5", "workload.group_size"),               # does not divide 32
    ("baseline=nccl", "baseline"),                                  # baseline not selected
    ("library.hccl.mover=dma", "library.hccl.mover"),               # not an enum value
])
def test_bad_config_fails_clearly(tmp_path, override, field) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli([f"hydra.run.dir={out}", override], tmp_path)
    assert proc.returncode == 2
    assert field in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one line, no traceback
    assert "_schema" not in proc.stderr
    assert not (out / "summary.json").exists()
    assert not (out / "results.parquet").exists()


@pytest.mark.parametrize("override, field", [
    ("library.hccl.launch_us=nan", "library.hccl.launch_us"),
    ("fabric.die.sdma.engine_GBps=inf", "fabric.die.sdma.engine_GBps"),
    ("workload.min_bytes=-1", "workload.min_bytes"),
])
def test_out_of_range_value_writes_nothing(tmp_path, override, field) -> None:  # noqa: ANN001
    """Ranges and cross-field checks run before Hydra creates the run directory."""
    out = tmp_path / "run"
    proc = run_cli([f"hydra.run.dir={out}", override], tmp_path)
    assert proc.returncode == 2 and field in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def test_a_value_found_bad_at_run_time_leaves_no_run_directory(tmp_path) -> None:  # noqa: ANN001
    """A layout the workload refuses once it runs (after Hydra made the run directory): one line,
    exit 2, and the directory Hydra made is gone with its log."""
    out = tmp_path / "run"
    proc = run_cli([f"hydra.run.dir={out}", "workload=llm_infer", "workload.layout.prefill_ep=7"], tmp_path)
    assert proc.returncode == 2 and "workload.layout.prefill_ep" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def test_multirun_with_joblib(tmp_path) -> None:  # noqa: ANN001
    sweep = tmp_path / "sweep"
    proc = run_cli(["--multirun", "workload.ranks=16,32", f"hydra.sweep.dir={sweep}", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    summaries = sorted(sweep.glob("*/summary.json"))
    assert len(summaries) == 2
    assert "Joblib" in proc.stdout + proc.stderr
    names = {p.parent.name for p in summaries}
    assert any("workload.ranks=16" in n for n in names)


def test_utilisation_series_written_on_request(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli([f"hydra.run.dir={out}", "output.utilisation=true", "workload.collectives=[allgather]",
                    *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    util = pd.read_parquet(out / "utilisation.parquet")
    assert {"time_s", "resource", "utilisation", "library"} <= set(util.columns)
    assert set(util["library"]) == {"hccl", "stratacl"}
    assert util["utilisation"].max() <= 1 + 1e-9 and util["utilisation"].max() > 0.5  # ports get busy


def _one_error_line(proc) -> str:  # noqa: ANN001
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.parametrize("args, field, quoted", [
    (["hydra.run.dir={d}/my", "runs/x"], "hydra.run.dir", "'hydra.run.dir=\"{d}/my runs/x\"'"),  # shell-split space
    (["hydra.run.dir={d}/é/x"], "hydra.run.dir", "'hydra.run.dir=\"{d}/é/x\"'"),                 # non-ASCII
    (["workload=replay", "workload.trace={d}/é/t.parquet"], "workload.trace", "'workload.trace=\"{d}/é/t.parquet\"'"),
    (["workload=llm_infer", "workload.requests.csv={d}/a", "b.csv"], "workload.requests.csv",
     "'workload.requests.csv=\"{d}/a b.csv\"'"),
])
def test_unquoted_path_says_how_to_quote_and_writes_nothing(tmp_path, args, field, quoted) -> None:  # noqa: ANN001
    d = tmp_path / "out"
    proc = run_cli([a.format(d=d) for a in args], tmp_path)
    line = _one_error_line(proc)
    assert f"config field '{field}'" in line and quoted.format(d=d) in line, line
    assert not d.exists()  # Hydra's grammar error used to come after the run directory was made
    assert not (tmp_path / "runs").exists()


def test_quoted_paths_with_spaces_and_non_ascii_run(tmp_path) -> None:  # noqa: ANN001
    src = tmp_path / "trace dir é"
    src.mkdir()
    trace = src / "t é.parquet"
    trace.write_bytes((Path(__file__).parent / "data" / "replay_small.parquet").read_bytes())
    out = tmp_path / "my runs" / "ré x"
    proc = run_cli(["workload=replay", f'workload.trace="{trace}"', f'hydra.run.dir="{out}"'], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["workload"] == "replay"
    assert str(trace) in proc.stdout  # the replay note names the file it read


@pytest.mark.parametrize("args, key", [
    (["library.hccl.launch_us=1", "library.hccl.launch_us=2"], "library.hccl.launch_us"),
    (["workload=moe", "workload=collectives"], "workload"),
    (["--multirun", "workload.ranks=16", "workload.ranks=32"], "workload.ranks"),
])
def test_a_key_given_twice_is_refused(tmp_path, args, key) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli([*args, f"hydra.run.dir={out}", f"hydra.sweep.dir={out}", *SMALL], tmp_path)
    line = _one_error_line(proc)
    assert f"config field '{key}'" in line and "given twice" in line, line
    assert not out.exists()


def test_a_batch_no_die_can_hold_is_refused_before_measuring(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli(["workload=llm_train", "workload.global_batch=1000000000", f"hydra.run.dir={out}"], tmp_path)
    line = _one_error_line(proc)
    assert "config field 'workload.global_batch'" in line and "HBM" in line and "global_batch ≤ " in line, line
    assert not out.exists()


def test_the_batch_bound_is_where_hidden_states_fill_hbm() -> None:
    from helpers import compose_run

    from stratacl.errors import ConfigError
    from workloads.llm_train.model import check_batch

    cfg = compose_run(["workload=llm_train"])
    check_batch(cfg.workload, cfg.fabric.die.hbm_GB)  # the paper's layout passes
    # DeepSeek-V3.2: hidden 7168, bf16; 4096-token sequences over fsdp 128 × tp 4 → 58.7 MB a sequence-share
    per_seq = 4096 * 7168 * 2 / (128 * 4)
    fit = int(cfg.fabric.die.hbm_GB * 1e9 // per_seq)
    cfg.workload.global_batch = fit
    check_batch(cfg.workload, cfg.fabric.die.hbm_GB)
    cfg.workload.global_batch = fit + 1
    with pytest.raises(ConfigError, match=f"global_batch ≤ {fit:,}"):
        check_batch(cfg.workload, cfg.fabric.die.hbm_GB)


def test_a_broken_list_is_a_syntax_hint_not_a_quoting_one(tmp_path) -> None:  # noqa: ANN001
    line = _one_error_line(run_cli(["workload.collectives=[allreduce", f"hydra.run.dir={tmp_path / 'r'}"], tmp_path))
    assert "config field 'workload.collectives'" in line and "key=[a,b]" in line and "quote" not in line, line
    assert not (tmp_path / "r").exists()


def test_the_same_override_repeated_is_one_override(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli(["seed=3", "seed=3", f"hydra.run.dir={out}", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["seed"] == 3
