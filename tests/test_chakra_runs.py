"""Traces out of runs and back in: `output.trace`, `chakra export <run dir>` with the simulated
compute times, no zero-work nodes, ASTRA-sim's SEND/RECV semantics on import, a missing rank file
named, `workload=replay`; and the agreement with a built ASTRA-sim where one is installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, chakra_or_skip, compose_run, make_library, run_cli

from stratacl.engine.replay import simulate
from stratacl.errors import TraceError
from stratacl.machine.fabric import Fabric
from stratacl.run.cli import run_overrides
from stratacl.trace import Trace

pb = chakra_or_skip()
from chakra.src.third_party.utils.protolib import encodeMessage  # noqa: E402

from stratacl.chakra.export import no_work  # noqa: E402
from stratacl.chakra.import_et import export_chakra, import_chakra, main, read_et  # noqa: E402

SMALL = ROOT / "tests" / "data" / "replay_small.parquet"
MiB = 1 << 20


@pytest.fixture(scope="module")
def hccl():  # noqa: ANN201
    return make_library(Fabric(compose_run([]).fabric), "hccl")


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:  # noqa: ANN001
    """A run with output.trace=true (workload=replay of a small mixed trace: compute, collectives,
    p2p, memcpy), both default libraries."""
    out = tmp_path_factory.mktemp("run")
    code, err = run_overrides(["workload=replay", f"workload.trace={SMALL}", "output.trace=true"], out)
    assert code == 0, err
    return out


def comp_nodes(folder: Path, prefix: str, world: int) -> dict[int, list]:
    return {r: [n for n in read_et(folder / f"{prefix}.{r}.et")[1] if n.type == pb.COMP_NODE] for r in range(world)}


def attr(node, name: str):  # noqa: ANN001, ANN201
    a = next(a for a in node.attr if a.name == name)
    return getattr(a, a.WhichOneof("value"))


# --------------------------------------------------------------------------- output.trace


def test_run_saves_each_replayed_trace_once_with_every_librarys_times(saved_run) -> None:  # noqa: ANN001
    index = json.loads((saved_run / "traces" / "index.json").read_text())
    assert len(index) == 1  # one trace object, replayed by two libraries: one file
    entry = index[0]
    trace = Trace.load(saved_run / "traces" / entry["file"])
    assert trace.to_frame().equals(Trace.load(SMALL).to_frame())
    summary = json.loads((saved_run / "summary.json").read_text())
    assert set(entry["makespan_s"]) == {"hccl", "stratacl"}
    for lib, t in entry["makespan_s"].items():
        assert t == summary["libraries"][lib]["iteration_time_s"]


def test_failed_run_leaves_no_traces(tmp_path) -> None:  # noqa: ANN001
    code, err = run_overrides(["workload=replay", f"workload.trace={SMALL}", "output.trace=true",
                               "limits.max_trace_ops=1"], tmp_path)
    assert code == 2 and "limits.max_trace_ops" in err
    assert not (tmp_path / "traces").exists() and not (tmp_path / "summary.json").exists()


# --------------------------------------------------------------------------- the round trip


def test_run_dir_export_import_replay_gives_the_same_time(saved_run, tmp_path, capsys) -> None:  # noqa: ANN001
    """run → traces/<name>.parquet → `chakra export <run dir>` → import (workload=replay of the ET
    set) → the same simulated iteration time per library as the run."""
    assert main(["export", str(saved_run), str(tmp_path / "et")]) == 0
    out = capsys.readouterr().out
    name = json.loads((saved_run / "traces" / "index.json").read_text())[0]["name"]
    assert "compute times of hccl's replay" in out  # the run's baseline by default
    before = json.loads((saved_run / "summary.json").read_text())["libraries"]
    code, err = run_overrides(["workload=replay", f"workload.trace={tmp_path / 'et' / name}"], tmp_path / "again")
    assert code == 0, err
    after = json.loads((tmp_path / "again" / "summary.json").read_text())["libraries"]
    for lib in ("hccl", "stratacl"):
        assert after[lib]["iteration_time_s"] == pytest.approx(before[lib]["iteration_time_s"], rel=1e-12)
        assert after[lib]["exposed_comm_s"] == pytest.approx(before[lib]["exposed_comm_s"], rel=1e-9, abs=1e-15)


def test_export_carries_each_ops_simulated_time(saved_run, tmp_path) -> None:  # noqa: ANN001
    name = json.loads((saved_run / "traces" / "index.json").read_text())[0]["name"]
    assert main(["export", str(saved_run / "traces" / f"{name}.parquet"), str(tmp_path), "--library", "stratacl"]) == 0
    import pandas as pd

    times = pd.read_parquet(saved_run / "traces" / f"{name}.times.parquet")
    times = times[times["library"] == "stratacl"].set_index("op")
    trace = Trace.load(SMALL)
    for r, nodes in comp_nodes(tmp_path, "trace", trace.world_size).items():
        for node in nodes:
            op = int(attr(node, "stratacl_op"))
            exact = times.at[op, "end_s"] - times.at[op, "start_s"]
            assert attr(node, "stratacl_duration_s") == pytest.approx(exact, rel=1e-12), (r, op)
            assert abs(node.duration_micros - exact * 1e6) <= 1.0
            assert node.start_time_micros == round(times.at[op, "start_s"] * 1e6)


def test_durations_keep_sub_microsecond_kernels_in_sum(tmp_path) -> None:  # noqa: ANN001
    """Chakra's duration is whole µs (ASTRA-sim replays duration_micros × 1000 ns): ten 2.4 µs
    kernels are written 2, 3, 2, 2, 3, … so they sum to 24 µs (plain rounding: 20 µs, −17 %)."""
    t = Trace(world_size=2)
    for i in range(10):
        t.compute([0, 1], fixed_time_s=2.4e-6, name=f"k{i}", stream="compute")
    export_chakra(t, tmp_path)
    for nodes in comp_nodes(tmp_path, "trace", 2).values():
        micros = [n.duration_micros for n in nodes]
        assert set(micros) == {2, 3} and sum(micros) == 24
        for k in range(1, 11):  # every run of consecutive kernels within 1 µs of its exact time
            assert abs(sum(micros[:k]) - 2.4 * k) <= 0.5 + 1e-9
        assert [attr(n, "stratacl_duration_s") for n in nodes] == [2.4e-6] * 10


# --------------------------------------------------------------------------- no zero-work nodes


def zero_work_trace() -> Trace:
    t = Trace(world_size=4, meta={"workload": "zero"})
    t.add_communicator("world", range(4))
    a = t.compute(range(4), flops=1e9, hbm_bytes=MiB, name="a", stream="compute")
    j = t.compute(range(4), flops=0, hbm_bytes=0, name="join", stream="aux", deps=[a])  # no work
    t.collective("allreduce", "world", MiB, name="ar", stream="comm", deps=[j])
    t.compute(range(4), flops=1e9, hbm_bytes=0, name="no_bytes", stream="compute")  # bytes 0
    t.add("memcpy", range(4), nbytes=[0, 2 * MiB, 2 * MiB, 2 * MiB], name="copy", stream="compute")
    t.add("memcpy", range(4), nbytes=0, name="empty_copy", stream="compute")  # no work
    t.compute(range(4), fixed_time_s=3e-6, name="fixed", stream="compute")  # 0 ops, 0 bytes, a time
    t.validate()
    return t


def test_no_zero_work_node_and_the_round_trip_keeps_every_op(tmp_path, hccl) -> None:  # noqa: ANN001
    """ASTRA-sim's roofline mode skips a 0-byte COMP node without issuing its dependants (a silent
    stall, `Workload::skip_invalid`) and prices 0 operations at 0/0: no node has either."""
    t = zero_work_trace()
    assert [op.name for op in t.ops if no_work(op)] == ["join", "empty_copy"]
    export_chakra(t, tmp_path)
    for r, nodes in comp_nodes(tmp_path, "trace", 4).items():
        names = [n.name for n in nodes]
        assert "join" not in names and "empty_copy" not in names, r
        for n in nodes:
            assert attr(n, "num_ops") >= 1 and attr(n, "tensor_size") >= 1, (r, n.name)
        # the allreduce that waited for `join` now waits for what join waited for: `a`
        coll = next(n for n in read_et(tmp_path / f"trace.{r}.et")[1] if n.type == pb.COMM_COLL_NODE)
        a_id = next(n.id for n in nodes if n.name == "a")
        assert list(coll.data_deps) == [a_id] and not coll.ctrl_deps
    back = import_chakra(tmp_path)
    assert back.to_frame().equals(t.to_frame())  # dropped ops and floored fields restored
    assert simulate(back, hccl).makespan_s == simulate(t, hccl).makespan_s


# --------------------------------------------------------------------------- SEND / RECV


def write_msccl_ring(folder: Path, world: int = 8, chunk: int = 131072, reduce_us: int = 7) -> None:
    """A ring all-reduce as ASTRA-sim's custom-collective example writes it
    (examples/system/custom_collectives/custom_ring_allreduce_8npus_1MB, from MSCCL's
    allreduce_a100_ring via collectiveapi's et_converter): on each rank SEND to r+1, RECV from
    r−1 (+ a 7 µs reduce COMP node for the reduce-scatter half), a chain of data deps, tag 0, SEND
    without comm_src and RECV without comm_dst."""
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        with (folder / f"custom_allreduce.{r}.et").open("wb") as f:
            encodeMessage(f, pb.GlobalMetadata(version="0.0.4"))
            for node in _ring_rank(r, world, chunk, reduce_us):
                encodeMessage(f, node)


def _ring_rank(r: int, world: int, chunk: int, reduce_us: int) -> list:
    send = [pb.AttributeProto(name="comm_type", int64_val=pb.COMM_SEND_NODE),
            pb.AttributeProto(name="comm_size", int64_val=chunk),
            pb.AttributeProto(name="comm_dst", int32_val=(r + 1) % world),
            pb.AttributeProto(name="comm_tag", int32_val=0)]
    recv = [pb.AttributeProto(name="comm_type", int64_val=pb.COMM_RECV_NODE),
            pb.AttributeProto(name="comm_size", int64_val=chunk),
            pb.AttributeProto(name="comm_src", int32_val=(r - 1) % world),
            pb.AttributeProto(name="comm_tag", int32_val=0)]
    specs = []
    for k in range(2 * (world - 1)):
        specs += [(f"COMM_SEND_NODE_tb0_step{2 * k}", pb.COMM_SEND_NODE, send, 0),
                  (f"COMM_RECV_NODE_tb0_step{2 * k + 1}", pb.COMM_RECV_NODE, recv, 0)]
        if k < world - 1:
            specs.append((f"COMP_NODE_tb0_step{2 * k + 1}", pb.COMP_NODE, [], reduce_us))
    nodes = []
    for i, (name, ntype, attrs, dur) in enumerate(specs):
        node = pb.Node(id=i, name=name, type=ntype, duration_micros=dur)
        node.attr.extend(attrs)
        if i:
            node.data_deps.append(i - 1)
        nodes.append(node)
    return nodes


def test_send_recv_ring_imports_with_eager_sends(tmp_path, hccl) -> None:  # noqa: ANN001
    """Every rank sends before it receives: with ASTRA-sim's semantics (a SEND's transfer starts
    when the sender is ready; a RECV ends when the transfer and its own deps have) the ring is no
    cycle, and its time is the closed form 2(n−1) transfers of the slowest ring pair plus the
    (n−1) reduce steps: the critical path of a ring all-reduce."""
    write_msccl_ring(tmp_path)
    trace = import_chakra(tmp_path)
    assert sum(op.kind == "p2p" for op in trace.ops) == 8 * 14
    assert sum(op.kind == "compute" for op in trace.ops) == 7  # a reduce step on all ranks: one op
    pair = []
    for s in range(8):
        one = Trace(world_size=8)
        one.add("p2p", (s, (s + 1) % 8), src=(s,), dst=((s + 1) % 8,), nbytes=131072)
        pair.append(simulate(one, hccl).makespan_s)
    assert simulate(trace, hccl).makespan_s == pytest.approx(14 * max(pair) + 7 * 7e-6, rel=1e-9)


def test_a_send_without_its_recv_is_named(tmp_path) -> None:  # noqa: ANN001
    write_msccl_ring(tmp_path)
    meta, nodes = read_et(tmp_path / "custom_allreduce.3.et")
    with (tmp_path / "custom_allreduce.3.et").open("wb") as f:
        encodeMessage(f, pb.GlobalMetadata(version="0.0.4"))
        for node in nodes[:-1]:  # drop rank 3's last RECV
            encodeMessage(f, node)
    with pytest.raises(TraceError, match="SEND 2->3 tag 0 has no matching RECV"):
        import_chakra(tmp_path)


# --------------------------------------------------------------------------- missing rank files


@pytest.mark.parametrize("missing", [3, 7])
def test_missing_rank_file_is_named(tmp_path, missing) -> None:  # noqa: ANN001
    export_chakra(Trace.load(SMALL), tmp_path / "own")  # 8 ranks
    (tmp_path / "own" / f"trace.{missing}.et").unlink()
    with pytest.raises(TraceError, match=re.escape(f"rank file {tmp_path / 'own' / f'trace.{missing}.et'} is missing")):
        import_chakra(tmp_path / "own")
    write_msccl_ring(tmp_path / "foreign")  # no world size in the files: the peers name rank 7
    (tmp_path / "foreign" / f"custom_allreduce.{missing}.et").unlink()
    with pytest.raises(TraceError, match=f"custom_allreduce.{missing}.et is missing"):
        import_chakra(tmp_path / "foreign")


# --------------------------------------------------------------------------- workload=replay


@pytest.mark.parametrize("make, problem", [
    (lambda d: d / "absent.parquet", "does not exist"),
    (lambda d: (d / "bad.parquet").write_bytes(SMALL.read_bytes()[:2000]) and d / "bad.parquet",
     "not a readable parquet trace"),
    (lambda d: d, "expected one set of <prefix>.<rank>.et files"),  # an empty directory
])
def test_replay_of_a_bad_trace_is_one_line_and_writes_nothing(tmp_path, make, problem) -> None:  # noqa: ANN001
    (tmp_path / "in").mkdir()
    path = make(tmp_path / "in")
    proc = run_cli(["workload=replay", f"workload.trace={path}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: config field 'workload.trace'") and problem in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "run").exists()


def test_replay_reports_per_library_time_exposure_and_ops(saved_run) -> None:  # noqa: ANN001
    import pandas as pd

    rows = pd.read_parquet(saved_run / "results.parquet")
    trace = Trace.load(SMALL)
    assert len(rows) == 2 * len(trace.ops) and set(rows["library"]) == {"hccl", "stratacl"}
    summary = json.loads((saved_run / "summary.json").read_text())
    for lib, m in summary["libraries"].items():
        sub = rows[rows["library"] == lib]
        assert m["iteration_time_s"] == pytest.approx(sub["end_s"].max())
        assert m["exposed_comm_s"] == pytest.approx(m["iteration_time_s"] - m["compute_s"])


# --------------------------------------------------------------------------- ASTRA-sim itself


ASTRA = os.environ.get("ASTRA_SIM_BIN") or shutil.which("AstraSim_Analytical_Congestion_Unaware")
NETWORK = "topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]  # GB/s\nlatency: [ 500.0 ]  # ns\n"
SYSTEM = {"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
          "preferred-dataset-splits": 1, "all-reduce-implementation": ["ring"],
          "all-gather-implementation": ["ring"], "reduce-scatter-implementation": ["ring"],
          "all-to-all-implementation": ["ring"], "collective-optimization": "localBWAware",
          "local-mem-bw": 1600, "boost-mode": 0, "roofline-enabled": 0, "peak-perf": 900}


def astra_sim_ns(folder: Path) -> list[int]:
    """Run ASTRA-sim's congestion-unaware analytical backend (examples/network/analytical/
    Ring_8npus.yml: α = 500 ns, 50 GB/s) on `<folder>/trace.*.et`; each NPU's finish time (ns)."""
    (folder / "net.yml").write_text(NETWORK)
    (folder / "sys.json").write_text(json.dumps(SYSTEM))
    (folder / "mem.json").write_text(json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}))
    proc = subprocess.run([ASTRA, f"--workload-configuration={folder / 'trace'}",
                           f"--comm-group-configuration={folder / 'trace.json'}",
                           f"--system-configuration={folder / 'sys.json'}",
                           f"--remote-memory-configuration={folder / 'mem.json'}",
                           f"--network-configuration={folder / 'net.yml'}"],
                          capture_output=True, text=True, timeout=300, cwd=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    done = [int(x) for x in re.findall(r"sys\[\d+\] finished, (\d+) cycles", proc.stdout + proc.stderr)]
    assert len(done) == 8, proc.stdout
    return done


@pytest.mark.skipif(ASTRA is None, reason="ASTRA-sim is not installed (set ASTRA_SIM_BIN or put "
                    "AstraSim_Analytical_Congestion_Unaware on PATH); this project does not build it")
def test_astra_sim_agrees_on_a_collective_and_an_iteration(tmp_path) -> None:  # noqa: ANN001
    """A single 8 MiB all-gather on the 8-NPU ring within 0.3 % of the α–β ring 7·(α + S/8/β);
    compute + all-gather + compute, one at a time, within 1 % of the carried compute times plus it."""
    ring = 7 * (500 + 8 * MiB / 8 / 50)  # ns (50 GB/s = 50 B/ns)
    t = Trace(world_size=8)
    t.add_communicator("world", range(8))
    t.collective("allgather", "world", 8 * MiB, name="ag")
    export_chakra(t, tmp_path / "one")
    assert max(astra_sim_ns(tmp_path / "one")) == pytest.approx(ring, rel=3e-3)
    t = Trace(world_size=8)
    t.add_communicator("world", range(8))
    a = t.compute(range(8), fixed_time_s=10.4e-6, name="pre")
    b = t.collective("allgather", "world", 8 * MiB, name="ag", deps=[a])
    t.compute(range(8), fixed_time_s=20.7e-6, name="post", deps=[b])
    export_chakra(t, tmp_path / "iter")
    assert max(astra_sim_ns(tmp_path / "iter")) == pytest.approx(10_400 + ring + 20_700, rel=1e-2)
