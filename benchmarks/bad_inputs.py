"""Bad inputs through the real CLI, classified: clean / traceback / runaway / accepted.

Each case runs `python -m stratacl.run <overrides>` (or the Chakra CLI) in a subprocess with a
time and memory bound. `clean` = exit 2, one stderr line naming a field or file, no traceback,
no summary.json; `traceback` = any other failure; `runaway` = over the time or memory bound;
`accepted` = exit 0 (listed so each can be judged: some inputs are legitimate).
Run: python benchmarks/bad_inputs.py [--only SUBSTR] [--timeout 120]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST = ["output.timeline=false", "output.progress=false"]
COLL = ["workload.max_bytes=1048576"]
INF = ["workload=llm_infer", "workload.requests.duration_s=5", "workload.capacity.saturation=false", "workload.warmup_s=1"]
DLRM = ["workload=dlrm_train", "workload.iterations=2", "workload.ranks=16"]
TRAIN = ["workload=llm_train", "workload.num_layers=2", "workload.iterations=[0]"]
NONROOT = "as-non-root"  # a case's first argument: run in a directory of its own, as a non-root user


def cases(tmp: Path) -> list[tuple[str, list[str]]]:
    """(class, args) for `python -m stratacl.run`; args starting with 'chakra' use the Chakra CLI."""
    c: list[tuple[str, list[str]]] = []
    for v in ("nan", "inf", "-inf"):  # non-finite numbers, every schema family
        for key in ("library.hccl.launch_us", "fabric.tiers.node.sync_us", "fabric.tiers.supernode.alpha_us",
                    "fabric.die.hbm_GBps", "library.stratacl.register_per_peer_us", "fabric.port_GBps.ub"):
            c.append(("non-finite", [key + "=" + v, *COLL]))
    for key, v in (("workload.requests.input_sigma", "-1"), ("workload.requests.rate", "0"),
                   ("workload.requests.burstiness", "-2"), ("workload.scheduler.mtp_acceptance", "1.5"),
                   ("workload.allocator.memory_utilization", "1.5"), ("workload.zipf_s", "-1"), ("workload.expert_load.imbalance", "0.5"),
                   ("workload.expert_load.imbalance", "1000"), ("workload.expert_load.ep", "0"),
                   ("workload.scheduler.prefill_token_budget", "0"), ("workload.layout.decode_dp", "0"),
                   ("workload.requests.input_min", "0"), ("workload.warmup_s", "-5")):
        c.append(("out of range (serving)", [*INF, f"{key}={v}"]))
    for key, v in (("workload.ranks", "0"), ("workload.ranks", "1000"), ("workload.group_size", "5"),
                   ("workload.min_bytes", "0"), ("workload.step_factor", "1"), ("workload.iters", "0"),
                   ("fabric.tiers.node.beta_GBps", "-5"), ("fabric.die.vector_cores", "0"),
                   ("library.hccl.comm_cores", "100"), ("library.hccl.fanout_cap", "0"),
                   ("library.hccl.pipeline_chunks", "0"), ("library.hccl.stage_anyway.allreduce", "2"),
                   ("fabric.topology.nodes", "7"), ("output.timeline_max_ranks", "0"), ("seed", "-1"),
                   ("fabric.die.kernel.hbm_saturation_cores", "25"), ("fabric.die.kernel.hbm_saturation_cores", "0"),
                   ("+library.hccl.moe_copy_us.dispatch_ll", "-1"), ("+library.hccl.moe_copy_us.dispatch_ll", "1e30"), ("+library.hccl.moe_copy_us.gather", "1")):
        c.append(("out of range (core)", [f"{key}={v}", *COLL]))
    for key, v in (("workload.ranks", "1"), ("workload.batch_per_worker", "0"), ("workload.zipf_exponent", "-1"),
                   ("workload.embedding_dim", "-8"), ("workload.total_table_TiB", "0")):
        c.append(("out of range (dlrm)", [*DLRM, f"{key}={v}"]))
    for key, v in (("workload.fsdp", "3"), ("workload.tp", "0"), ("workload.seq_len", "0"),
                   ("workload.iterations", "[-1]"), ("workload.global_batch", "0")):
        c.append(("out of range (training)", [*TRAIN, f"{key}={v}"]))
    for args in (["limits.max_requests=0"], ["output.timeline_max_ranks=-1"], ["fabric.topology.dies_per_npu=0"],
                 ["library.hccl.auto_candidates=[warp]"], ["workload=moe", "workload.skew=histogram",
                                                            "workload.histogram=[1,-1]"],
                 [*DLRM, "workload.pooling_factors=[0]"], [*DLRM, "workload.rows_per_feature=[0]"],
                 [*INF, "workload.layout.prefill_ep=7"], [*INF, "workload.requests.input_max=1"]):
        c.append(("cross-field / lists", [*args, *COLL]))
    for key, v in (("workload.ranks", "abc"), ("library.hccl.launch_us", "fast"), ("seed", "1.5"),
                   ("workload.collectives", "allreduce"), ("output.timeline", "maybe"),
                   ("library.hccl.unit_KiB", "[1,2]")):
        c.append(("wrong type", [f"{key}={v}", *COLL]))
    for args in (["workload=llm_infer", "workload.requests.arrival=weibull"], ["library.hccl.mover=dma"],
                 ["library.hccl.data_path=magic"], ["library.hccl.partitioning=evenly"], ["workload=dlrm_train", "workload.sharding=diagonal"],
                 ["workload=moe", "workload.modes=[xl]"], ["workload=moe", "workload.skew=pareto"],
                 ["fabric.tiers.node.plane=nvlinkx"], ["workload=llm_infer", "workload.requests.trace=sharegpt",
                                                       "workload.requests.arrival=trace"],
                 ["library.hccl.algorithm=bogus"], ["workload.collectives=[allreduce,scatterv]"]):
        c.append(("unknown choice", [*args, *COLL]))
    for args in (["library=[hccl,nosuchlib]"], ["fabric=nosuchfabric"], ["workload=nope"],
                 ["+experiment=nope"], ["workload=collectives_schema"], ["library=[hccl,hccl]"],
                 ["baseline=nccl"], ["workload=llm_infer", "workload.model.preset=gpt5"],
                 ["fabric=dgx_b200"], ["workload.rnaks=3"]):
        c.append(("unknown preset / key", [*args, *COLL]))
    for args in (["workload.requests.duration_s=1e6"], ["workload.requests.rate=1e12"],
                 ["workload.requests.rate=1e6", "workload.requests.duration_s=600"]):
        c.append(("runaway size (serving)", ["workload=llm_infer", *args]))
    for args in (["workload=dlrm_train", "workload.iterations=100000000"], ["workload.iters=100000000"],
                 ["workload=moe", "workload.iters=100000000"], ["workload.min_bytes=1", "workload.max_bytes=1e18",
                                                                 "workload.iters=1000000"]):
        c.append(("runaway size (traces)", args))
    # files: request tables, model configs, directories
    tables = {"text": "arrival_s,input_tokens,output_tokens\n0,10,5\nabc,1,1\n",
              "empty cell": "arrival_s,input_tokens,output_tokens\n0,10,5\n1,,1\n",
              "nan": "arrival_s,input_tokens,output_tokens\nnan,10,5\n",
              "inf": "arrival_s,input_tokens,output_tokens\ninf,10,5\n",
              "negative": "arrival_s,input_tokens,output_tokens\n0,-10,5\n",
              "columns": "a,b\n1,2\n", "empty": "", "binary": "\x00\xff\xfe"}
    for name, body in tables.items():
        p = tmp / f"req_{name.replace(' ', '_')}.csv"
        p.write_text(body, errors="surrogateescape") if "\x00" not in body else p.write_bytes(body.encode("latin-1"))
        c.append(("request table", [*INF, "workload.requests.arrival=csv", f"workload.requests.csv={p}"]))
    c.append(("request table", [*INF, "workload.requests.arrival=csv", f"workload.requests.csv={tmp}/missing.csv"]))
    jsons = {"array": "[1, 2]", "wrong type": '{"model_type": "llama", "hidden_size": "big"}',
             "negative layers": '{"model_type": "llama", "num_hidden_layers": -2}', "broken": '{"model_type": ',
             "unknown type": '{"model_type": "gpt9"}', "zero heads": '{"model_type": "llama", "num_attention_heads": 0}'}
    for name, body in jsons.items():
        p = tmp / f"cfg_{name.replace(' ', '_')}.json"
        p.write_text(body)
        c.append(("config_json", [*INF, "workload.model.preset=", f"workload.model.config_json={p}"]))
    ro = tmp / "readonly"
    ro.mkdir(exist_ok=True)
    os.chmod(ro, 0o500)
    c.append(("directories", [*INF, f"workload.cache_dir={ro}/cache"]))
    c.append(("directories", [*INF, "workload.cache_dir=/proc/nope"]))
    c.append(("directories", [f"hydra.run.dir={ro}/run", *COLL]))
    c.append(("directories", ["hydra.run.dir=/proc/run", *COLL]))
    # issue #32 bad inputs: permissions as a non-root user, a batch no die holds, path quoting, a key twice
    nonroot = tmp / "nonroot_cwd"  # a working directory whose runs/ this user may not write
    (nonroot / "runs").mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o755)
    os.chmod(nonroot, 0o755)
    os.chmod(nonroot / "runs", 0o555)
    c.append(("non-root: unwritable runs/", [NONROOT, *COLL]))
    c.append(("non-root: unwritable runs/", [NONROOT, "hydra.run.dir=runs/mine", *COLL]))
    c.append(("huge global_batch", [*TRAIN, "workload.global_batch=1000000000"]))
    c.append(("huge global_batch", ["workload=llm_train", "workload.global_batch=1000000000"]))
    c.append(("unquoted path with space", [f"hydra.run.dir={tmp}/my", "runs/x", *COLL]))
    c.append(("unquoted path with space", [*INF, "workload.requests.arrival=csv", f"workload.requests.csv={tmp}/a",
                                           "b.csv"]))
    c.append(("non-ASCII path", ["workload=replay", f"workload.trace={tmp}/é/t.parquet"]))
    c.append(("non-ASCII path", [f"hydra.run.dir={tmp}/é/x", *COLL]))
    c.append(("duplicate key", ["library.hccl.launch_us=1", "library.hccl.launch_us=2", *COLL]))
    c.append(("duplicate key", ["--multirun", "workload.ranks=16", "workload.ranks=32", *COLL]))
    # presets in every workload
    for preset in ("llama3_8b", "mixtral_8x7b", "qwen3_moe", "deepseek_v3", "deepseek_v32"):
        c.append(("model presets", [*INF, f"workload.model.preset={preset}"]))
    for preset in ("llama3_8b", "qwen3_moe"):
        c.append(("model presets", [*TRAIN, f"workload.model.preset={preset}"]))
    # Chakra import of corrupt files and bad prefixes
    c.append(("chakra", ["chakra", "import", str(tmp / "nodir"), str(tmp / "o.parquet")]))
    etdir = tmp / "et"
    etdir.mkdir(exist_ok=True)
    (etdir / "trace.0.et").write_bytes(b"\x07garbage\xff\xff\xff")
    c.append(("chakra", ["chakra", "import", str(etdir), str(tmp / "o.parquet")]))
    bad_trace = tmp / "corrupt.parquet"
    bad_trace.write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")
    c.append(("chakra", ["chakra", "export", str(bad_trace), str(tmp / "etout")]))
    c.append(("chakra", ["chakra", "export", str(bad_trace), str(tmp / "etout"), "--prefix", "../../escape"]))
    # GPU preset: a library whose plane the fabric lacks (Ascend presets on GPU fabrics and
    # back); the error names the presets made for the fabric
    for args in (["fabric=hgx_h100", "library=[nccl,stratacl]", "baseline=nccl"],
                 ["fabric=gb200_nvl72", "library=[nccl,hccl]", "baseline=nccl"],
                 ["library=[hccl,stratacl_gpu]"], ["library.stratacl.vector_core_colls=[gather]"]):
        c.append(("plane mismatch (gpu)", [*args, *COLL]))
    # your own model and requests: unsupported families, two models named, tables given wrongly
    gpt2 = tmp / "byo_gpt2.json"
    gpt2.write_text('{"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "vocab_size": 50257}')
    for wl in (INF, TRAIN):
        c.append(("byo model", [*wl, f"workload.model.config_json={gpt2}"]))
        c.append(("byo model", [*wl, "workload.model.model_type=gpt9"]))
        c.append(("byo model", [*wl, "workload.model.preset=llama3_8b", f"workload.model.config_json={ROOT}/workloads/"
                                "modelcost/examples/Meta-Llama-3-70B/config.json"]))
    ok = tmp / "byo_ok.csv"
    ok.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{i * 0.5},256,8\n" for i in range(20)))
    short = tmp / "byo_short.csv"
    short.write_text("arrival_s,input_tokens,output_tokens\n0,256,8\n0.5,256,8\n")
    missing = tmp / "byo_missing_column.csv"
    missing.write_text("arrival_s,input_tokens\n0,256\n1,256\n")
    corrupt = tmp / "byo_corrupt.csv"
    corrupt.write_bytes(b"arrival_s,input_tokens,output_tokens\n0,256,8\n\x00\xff\xfe,\x01\n")
    c.append(("byo requests", [*INF, f"workload.requests.csv={ok}"]))  # a table without arrival=csv
    c.append(("byo requests", [*INF, "workload.requests.arrival=csv"]))  # arrival=csv without a table
    for table in (short, missing, corrupt):  # shorter than the 1 s warm-up; a missing column; corrupt bytes
        c.append(("byo requests", [*INF, "workload.requests.arrival=csv", f"workload.requests.csv={table}"]))
    # fabric pieces: a die piece (conf/gpu) is no fabric and no group of the run
    c.append(("fabric pieces", ["fabric=b200", *COLL]))
    c.append(("fabric pieces", ["fabric=../gpu/b200", *COLL]))
    c.append(("fabric pieces", ["+gpu=b200", *COLL]))
    # the MoE shape: a replayed trace whose dispatch has no MoeShape, or a bad one
    for name, moe in (("moe_missing", None), ("moe_bad", {"dispatch_bytes_per_copy": 7168.0,
                      "combine_bytes_per_copy": 14336.0, "experts_per_rank": 0, "top_k": 8})):
        c.append(("moe shape (replay)", ["workload=replay", f"workload.trace={_moe_trace(tmp / f'{name}.parquet', moe)}"]))
    return c


def _moe_trace(path: Path, moe: dict | None) -> Path:
    """A 4-rank LL dispatch saved with the MoeShape `moe` (None: without one); saving does not validate."""
    sys.path.insert(0, str(ROOT))  # this checkout's stratacl, not an installed one
    from stratacl.trace import MoeShape, Trace

    tr = Trace(world_size=4, moe=MoeShape.from_json(moe) if moe else None)
    tr.add_family("ep", [range(4)])
    tr.collective("dispatch", "ep", 65536.0, peer_bytes=[[0, 1, 2, 3]] * 4, moe_mode="ll", name="L0.dispatch")
    return tr.save(path)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a runaway dies instead of swapping


def _non_root() -> tuple[int, int]:
    """(uid, gid) permissions apply to: this user's, or `nobody`'s when run as root."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    import pwd

    who = pwd.getpwnam("nobody")
    return who.pw_uid, who.pw_gid


def _as(uid: int, gid: int):  # noqa: ANN202 - a preexec_fn
    def start() -> None:
        _limit_memory()
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
    return start


def classify(args: list[str], tmp: Path, timeout: float) -> tuple[str, str]:
    out = tmp / f"run{time.perf_counter_ns()}"
    cwd, env, start = ROOT, None, _limit_memory
    if args[0] == NONROOT:  # in a directory of its own, as a user file permissions apply to
        args, cwd, start = args[1:], tmp / "nonroot_cwd", _as(*_non_root())
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp)}
    if args[0] == "chakra":
        cmd = [sys.executable, "-m", "stratacl.chakra", *args[1:]]
    else:
        keys = {a.partition("=")[0] for a in args}  # a case's own value of a FAST key wins (no key twice)
        cmd = [sys.executable, "-m", "stratacl.run", *args, *(f for f in FAST if f.partition("=")[0] not in keys)]
        if not any(a.startswith("hydra.run.dir") for a in args) and cwd == ROOT:
            cmd.append(f"hydra.run.dir={out}")
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=start)
    except subprocess.TimeoutExpired:
        return "runaway", f"> {timeout:.0f} s"
    err = p.stderr.strip()
    if p.returncode == 0:
        return "accepted", (p.stdout.strip().splitlines() or [""])[-1][:100]
    if isinstance(p.returncode, int) and p.returncode < 0 or "MemoryError" in err:
        return "runaway", f"killed ({p.returncode})"
    lines = [ln for ln in err.splitlines() if not ln.startswith("[")]  # progress lines are not errors
    one = len(lines) == 1 and lines[0].startswith("error: ")
    if p.returncode == 2 and one and "Traceback" not in err and not (out / "summary.json").exists():
        return "clean", lines[0][:160]
    return "traceback", (lines[-1] if lines else err)[:160]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bad_inputs_"))
    table: Counter = Counter()
    by_class: dict[str, Counter] = {}
    rows = []
    for cls, args in cases(tmp):
        if a.only and a.only not in cls:
            continue
        verdict, detail = classify(args, tmp, a.timeout)
        table[verdict] += 1
        by_class.setdefault(cls, Counter())[verdict] += 1
        rows.append({"class": cls, "args": " ".join(args), "verdict": verdict, "detail": detail})
        print(f"{verdict:9s} {cls:24s} {' '.join(args)[:90]}\n          {detail}", flush=True)
    print("\n| class | cases | clean | traceback | runaway | accepted |\n|---|---|---|---|---|---|")
    for cls, cnt in by_class.items():
        print(f"| {cls} | {sum(cnt.values())} | {cnt['clean']} | {cnt['traceback']} | {cnt['runaway']} | {cnt['accepted']} |")
    print(f"| **total** | {sum(table.values())} | {table['clean']} | {table['traceback']} | {table['runaway']} | "
          f"{table['accepted']} |")
    (tmp / "bad_inputs.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
