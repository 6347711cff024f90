"""Issue 23's hazards of the user's loop: run directories, measurement windows, hints, the
progress line, Ctrl-C of a sweep and a non-editable install."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from helpers import CONF, ROOT, compose_run, run_cli

from stratacl import paths
from stratacl.config import validate_run
from stratacl.errors import ConfigError
from stratacl.progress import Progress
from stratacl.run.precheck import misplaced

SMALL = ["workload.max_bytes=1048576", "output.timeline=false"]
INFER = ["workload=llm_infer"]


def _one_line_refusal(proc: subprocess.CompletedProcess, field: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: config field '{field}'"), proc.stderr


# --------------------------------------------------------------------------- 6. run directories


@pytest.mark.parametrize("args, field", [
    (["hydra.run.dir="], "hydra.run.dir"),
    (["hydra.run.dir=''"], "hydra.run.dir"),
    (["--multirun", "hydra.sweep.dir=", "workload.ranks=16,32"], "hydra.sweep.dir"),
])
def test_an_empty_output_directory_is_refused_and_nothing_written(tmp_path, args, field) -> None:  # noqa: ANN001
    proc = run_cli([*args, *SMALL], tmp_path)
    _one_line_refusal(proc, field)
    assert list(tmp_path.iterdir()) == []  # no summary.json, timeline or .hydra/ in the cwd


def test_a_run_into_a_directory_holding_another_run_is_refused(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    assert run_cli([f"hydra.run.dir={out}", *SMALL], tmp_path).returncode == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "run.log"}
    proc = run_cli([f"hydra.run.dir={out}", "seed=3", *SMALL], tmp_path)
    _one_line_refusal(proc, "hydra.run.dir")
    assert "already holds a run" in proc.stderr
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "run.log"}
    assert after == before  # the first run's results and its config, untouched (seed 0 in both)
    assert "seed: 0" in (out / ".hydra" / "config.yaml").read_text()


# --------------------------------------------------------------------------- 7. measurement windows


@pytest.mark.parametrize("overrides, field", [
    (["workload.warmup_s=30", "workload.requests.duration_s=20"], "workload.warmup_s"),
    (["workload.warmup_s=20", "workload.requests.duration_s=20"], "workload.warmup_s"),
    (["workload.warmup_s=0", "workload.requests.duration_s=1e-9"], "workload.requests.duration_s"),
    # 15 req/s over [0, 0.05) s: 0.75 expected arrivals
    (["workload.warmup_s=0", "workload.requests.duration_s=0.05"], "workload.requests.duration_s"),
    (["workload.capacity.saturation_warmup_s=60"], "workload.capacity.saturation_warmup_s"),
])
def test_an_empty_measurement_window_is_refused(overrides, field) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError) as err:
        validate_run(compose_run([*INFER, *overrides]))
    assert err.value.field == field and err.value.fix


@pytest.mark.parametrize("overrides", [
    ["workload.warmup_s=0", "workload.requests.duration_s=0.07"],  # 1.05 expected arrivals: admitted
    ["workload.mode=fixed", "workload.warmup_s=100"],  # fixed shapes have no window
    ["workload.requests.trace_timing=recorded", "workload.warmup_s=0", "workload.requests.duration_s=0.01"],
    ["workload.capacity.saturation=false", "workload.capacity.saturation_warmup_s=60"],
])
def test_windows_that_can_hold_a_measurement_are_admitted(overrides) -> None:  # noqa: ANN001
    validate_run(compose_run([*INFER, *overrides]))


def test_a_window_refusal_on_the_cli_writes_nothing(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli([f"hydra.run.dir={out}", *INFER, "workload.warmup_s=30", "workload.requests.duration_s=20"],
                   tmp_path)
    _one_line_refusal(proc, "workload.warmup_s")
    assert not out.exists()


TINY = ("{num_hidden_layers:3,first_k_dense_replace:1,hidden_size:256,intermediate_size:512,"
        "moe_intermediate_size:128,n_routed_experts:16,num_experts_per_tok:4,n_group:1,topk_group:1,"
        "num_attention_heads:4,num_key_value_heads:4,kv_lora_rank:64,q_lora_rank:64,qk_rope_head_dim:16,"
        "qk_nope_head_dim:32,v_head_dim:32,vocab_size:1024}")
TINY_SERVE = [*INFER, "workload.model.preset=deepseek_v3", f"+workload.model.overrides={TINY}",
              "workload.layout.prefill_instances=1", "workload.layout.prefill_dp=4", "workload.layout.prefill_ep=4",
              "workload.layout.decode_instances=1", "workload.layout.decode_dp=4", "workload.layout.decode_ep=4",
              "workload.requests.arrival=poisson", "workload.requests.rate=20", "workload.warmup_s=0",
              "workload.cache_dir=", "workload.capacity.saturation=false", "output.timeline=false",
              "output.progress=false"]


def test_a_window_without_a_token_is_refused_not_reported_as_zero(tmp_path) -> None:  # noqa: ANN001
    # 1.2 expected arrivals pass the precheck; seed 0 draws none before 0.06 s: no token, no rate
    out = tmp_path / "run"
    proc = run_cli([*TINY_SERVE, "workload.requests.duration_s=0.06", f"hydra.run.dir={out}"], tmp_path)
    _one_line_refusal(proc, "workload.requests.duration_s")
    assert "no output token falls inside the measured window [0, 0.06) s (0 requests" in proc.stderr
    assert not (out / "summary.json").exists()


# --------------------------------------------------------------------------- 8. hints


def test_a_knob_of_an_unselected_library_says_to_select_it() -> None:
    for ov in ("library.nccl.comm_cores=8", "+library.nccl.comm_cores=8"):
        msg = misplaced([ov, "library=[hccl,stratacl]"])
        assert "library 'nccl' is not selected" in msg and "library=[hccl,stratacl,nccl]" in msg, msg
        assert "+key" not in msg
    assert "unknown library 'foo'" in misplaced(["library.foo.x=1"])
    assert misplaced(["library=[hccl,nccl]", "library.nccl.comm_cores=8"]) == ""  # selected: no hint


def test_cli_hints_for_library_and_model(tmp_path) -> None:  # noqa: ANN001
    proc = run_cli(["library.nccl.comm_cores=8", "library=[hccl,stratacl]"], tmp_path)
    _one_line_refusal(proc, "library.nccl.comm_cores")
    assert "select it: library=[hccl,stratacl,nccl]" in proc.stderr
    proc = run_cli(["model=deepseek_v3"], tmp_path)
    _one_line_refusal(proc, "model")
    assert "workload.model.preset=<name>" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_help_lists_only_what_a_user_can_pass(tmp_path) -> None:  # noqa: ANN001
    proc = run_cli(["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "_schema" not in proc.stdout
    groups = proc.stdout.split("Groups (group=option):")[1].split("\n\n")[0]
    assert "\n  model:" not in groups and "workload.model.preset=<name>" in groups
    assert "llm_infer" in groups and "cloudmatrix384" in groups
    assert "workload:\n  name: collectives" in proc.stdout  # then the composed config


def test_every_conf_directory_ships_with_a_regular_install() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    shipped = {Path(k).relative_to("share/stratacl-harness/conf") for k in data}
    have = {p.parent.relative_to(CONF) for p in Path(CONF).rglob("*.yaml")}
    assert have <= shipped, have - shipped
    for target, globs in data.items():  # each entry copies its own directory's files
        assert all(Path(g).parent == Path(target).relative_to("share/stratacl-harness") for g in globs)


def test_conf_is_found_in_an_installed_prefix(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    shipped = tmp_path / "share" / "stratacl-harness" / "conf"
    shipped.mkdir(parents=True)
    (shipped / "config.yaml").write_text("{}\n")
    monkeypatch.setattr(paths, "_CHECKOUT", tmp_path / "site-packages" / "conf")  # no checkout beside
    monkeypatch.setattr(paths.sysconfig, "get_path", lambda name: str(tmp_path))
    assert paths._conf_dir() == shipped
    assert Path(CONF) == paths.CONF  # in this checkout: the checkout's conf/


@pytest.mark.slow
def test_a_regular_install_runs_from_anywhere(tmp_path) -> None:  # noqa: ANN001
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(ROOT)], check=True, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "stratacl.run", *SMALL,
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "summary.json").is_file()


# --------------------------------------------------------------------------- 9. progress, Ctrl-C


def test_a_phase_that_ends_says_done_not_zero_percent(capsys) -> None:  # noqa: ANN001
    p = Progress("llm_infer", tty=False)
    p.phase("serve hccl", total=60, unit="sim s")  # the workload never advanced it
    p.phase("serve stratacl", total=60, unit="sim s")
    p(30)
    p.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4, lines  # each phase: its start line, its end line
    assert lines[0].startswith("[llm_infer] serve hccl:   0% (0/60 sim s)")  # at its start, 0 % is true
    assert lines[1].startswith("[llm_infer] serve hccl: done in ")  # at its end it is not
    assert lines[3].startswith("[llm_infer] serve stratacl: done in ")


def _sigint_default() -> None:
    """A terminal's foreground job takes SIGINT at its default; a job started in the background of a
    non-interactive shell inherits it ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_of_a_sweep_prints_one_resume_line(tmp_path) -> None:  # noqa: ANN001
    sweep = tmp_path / "sweep"
    # points of ~30 s each (the default serving run), so the signal lands inside the first on any machine
    args = ["--multirun", "workload=llm_infer", "seed=0,1", "output.timeline=false", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.Popen([sys.executable, "-m", "stratacl.run", *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_sigint_default)
    deadline = time.monotonic() + 120
    while not list(sweep.glob("*/.hydra")) and time.monotonic() < deadline:  # points started
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = [ln for ln in err.splitlines() if ln.strip()][-1]
    assert last == ("interrupted: finished points are kept; resume with: python -m stratacl.run "
                    f"--multirun workload=llm_infer seed=0,1 output.timeline=false "
                    f"hydra.sweep.dir={sweep} resume=true")
    assert not list(sweep.glob("*/summary.json"))  # interrupted points wrote no summary


# --------------------------------------------------------------------------- 10. your own model

EXAMPLES = ROOT / "workloads" / "modelcost" / "examples"
LLAMA_70B = EXAMPLES / "Meta-Llama-3-70B" / "config.json"
QWEN3_30B = EXAMPLES / "Qwen3-30B-A3B" / "config.json"
GPT2 = '{"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "vocab_size": 50257}'


@pytest.mark.parametrize("workload", ["llm_train", "llm_infer"])
def test_a_config_json_replaces_the_default_preset(workload: str) -> None:
    from workloads.common.model import hf_config, model_name

    ref = compose_run([f"workload={workload}", f"workload.model.config_json={LLAMA_70B}"]).workload.model
    assert ref.preset == ""  # the workload's default preset is not used
    hf = hf_config(ref)
    assert (hf.model_type, hf.num_hidden_layers, hf.hidden_size, hf.intermediate_size) == ("llama", 80, 8192, 28672)
    assert str(LLAMA_70B) in model_name(ref)
    ref = compose_run([f"workload={workload}", "workload.model.model_type=qwen3_moe"]).workload.model
    assert ref.preset == "" and hf_config(ref).model_type == "qwen3_moe"


def test_a_config_json_gives_every_model_quantity() -> None:
    """Parameters, depth and experts of the run come from the user's config.json (public totals:
    Llama-3-70B 70.6 B, Qwen3-30B-A3B 30.5 B parameters, the model cards)."""
    from workloads.common.model import describe_model, hf_config
    from workloads.llm_train.workload import estimate
    from workloads.modelcost import ModelCosts

    for path, params, layers, experts in ((LLAMA_70B, 70.6e9, 80, 0), (QWEN3_30B, 30.5e9, 48, 128)):
        ref = compose_run(["workload=llm_infer", f"workload.model.config_json={path}"]).workload.model
        mc = ModelCosts(hf_config(ref))
        assert mc.total_params() == pytest.approx(params, rel=0.01)
        assert mc.moe_info()["n_routed_experts"] == experts and len(mc.layer_plan()) == layers
        assert f"{layers} layers" in describe_model(ref, mc)
    train = compose_run(["workload=llm_train", f"workload.model.config_json={LLAMA_70B}"]).workload
    default = compose_run(["workload=llm_train"]).workload  # DeepSeek-V3.2: 61 layers
    assert estimate(train).trace_ops - 64 == 40 * 80 and estimate(default).trace_ops - 64 == 40 * 61


def test_a_preset_and_a_config_json_both_given_are_refused(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli(["workload=llm_train", "workload.model.preset=llama3_8b", f"workload.model.config_json={LLAMA_70B}",
                    f"hydra.run.dir={out}"], tmp_path)
    _one_line_refusal(proc, "workload.model.preset")
    assert "drop workload.model.preset" in proc.stderr and not out.exists()


@pytest.mark.parametrize("args, field, named", [
    (["workload.model.config_json={gpt2}"], "workload.model.config_json", "'gpt2'"),
    (["workload.model.model_type=gpt9"], "workload.model.model_type", "'gpt9'"),
    (["workload.model.model_type=gpt_neox"], "workload.model.model_type", "'gpt_neox'"),
])
@pytest.mark.parametrize("workload", ["llm_train", "llm_infer"])
def test_an_unsupported_model_family_is_refused_naming_the_supported(tmp_path, workload, args, field,  # noqa: ANN001
                                                                     named) -> None:  # noqa: ANN001
    from workloads.modelcost.config import SUPPORTED_FAMILIES

    gpt2 = tmp_path / "config.json"
    gpt2.write_text(GPT2)
    with pytest.raises(ConfigError) as err:
        validate_run(compose_run([f"workload={workload}", *(a.format(gpt2=gpt2) for a in args)]))
    assert err.value.field == field and named in err.value.problem
    assert all(f in err.value.problem for f in SUPPORTED_FAMILIES)


def test_a_gpt2_config_on_the_cli_is_one_line_and_writes_nothing(tmp_path) -> None:  # noqa: ANN001
    gpt2 = tmp_path / "config.json"
    gpt2.write_text(GPT2)
    out = tmp_path / "run"
    proc = run_cli(["workload=llm_train", f"workload.model.config_json={gpt2}", f"hydra.run.dir={out}"], tmp_path)
    _one_line_refusal(proc, "workload.model.config_json")
    assert "Traceback" not in proc.stderr and "llama" in proc.stderr and not out.exists()


TINY_FAMILY = dict(num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=1000)


MEASURED_HERE = ["llama", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v32", "deepseek_v4"]


def test_every_supported_family_has_a_measurement_test() -> None:
    from workloads.modelcost.config import SUPPORTED_FAMILIES

    assert {*MEASURED_HERE, "deepseek_v3"} == set(SUPPORTED_FAMILIES)  # deepseek_v3: tests/test_llm_infer.py


@pytest.mark.parametrize("family", MEASURED_HERE)
def test_every_supported_family_is_measured_at_every_phase(family: str) -> None:
    """What SUPPORTED_FAMILIES promises: the real modules measured at a tiny size, every phase."""
    from workloads.modelcost import ModelCosts, load_model_config
    from workloads.modelcost.config import CONFIG_MAPPING, _valid_keys

    keys = _valid_keys(CONFIG_MAPPING[family])
    mc = ModelCosts(load_model_config(family, {k: v for k, v in TINY_FAMILY.items() if k in keys}))
    for phase, tokens, ctx in (("prefill", 64, 0), ("decode", 8, 64), ("train_fwd", 64, 0), ("train_bwd", 64, 0)):
        costs = mc.costs_for_shape(tokens, context=ctx, phase=phase, seq_len=64 if phase != "decode" else None)
        assert sum(c.flops for c in costs.values()) > 0, phase
    assert mc.kv_bytes_per_token() > 0 and mc.total_params() > 0


def test_an_interrupt_inside_a_finalizer_is_delivered_again() -> None:
    """Ctrl-C landing in a `__del__` (Python swallows it there, printing a traceback) is raised
    again outside it: the run's handlers see it (`stratacl.run.cli.interrupt_outside_finalizers`)."""
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from stratacl.run.cli import interrupt_outside_finalizers\n"
            "interrupt_outside_finalizers()\n"
            "class D:\n"
            "    def __del__(self):\n"
            "        raise KeyboardInterrupt\n"
            "try:\n"
            "    D()\n"
            "    time.sleep(5)\n"
            "except KeyboardInterrupt:\n"
            "    print('caught', file=sys.stderr); sys.exit(130)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130 and proc.stderr.strip() == "caught", proc.stderr
