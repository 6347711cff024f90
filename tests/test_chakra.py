"""Chakra ET export / import: round trip, what other tools see, foreign traces, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_library

from stratacl.engine.replay import Replay
from stratacl.errors import TraceError
from stratacl.trace import Op, Trace

pytest.importorskip("chakra")
from chakra.schema.protobuf import et_def_pb2 as pb  # noqa: E402
from chakra.src.third_party.utils.protolib import encodeMessage  # noqa: E402

from stratacl.chakra import export_chakra, import_chakra, read_et  # noqa: E402

MiB = 1 << 20


def rich_trace() -> Trace:
    """Every op kind, a family and a single communicator, an unsorted group, per-rank vectors,
    alltoallv rows, a cross-rank dependency, two streams and an unnamed op."""
    t = Trace(world_size=8, meta={"workload": "test", "layers": 2})
    t.add_family("tp", [[0, 1, 2, 3], [7, 6, 5, 4]])
    t.add_communicator("ep", range(8))
    t.add_buffer("act", -1)
    a = t.compute(range(8), flops=[1e12 + i * 1e9 for i in range(8)], hbm_bytes=4 * MiB, core="cube",
                  name="attn")
    b = t.collective("allreduce", "tp", MiB, name="tp_ar", buffer="act", deps=[a])
    peers = [float((i * 8 + j) * 1024) for i in range(8) for j in range(8)]
    c = t.collective("alltoallv", "ep", 64 * 1024, peer_bytes=peers, name="dispatch_v", deps=[b])
    t.add("p2p", range(8), src=list(range(8)), dst=[1, 2, 3, 4, 5, 6, 7, 0],
          nbytes=[(i + 1) * 4096 for i in range(8)], stream="pp", name="ring_shift")
    t.add("memcpy", [3, 1], nbytes=[100, 200], name="stage")
    d = t.compute([0], flops=0, hbm_bytes=0, fixed_time_s=2.5e-6, core="vector", stream="aux")
    t.compute([5], flops=1e9, hbm_bytes=MiB, core="vector", deps=[d], name="waits_on_rank0")
    t.collective("allgather", "tp[1]", 2 * MiB, name="ag_one_group", deps=[c])
    t.collective("broadcast", "ep", 8 * MiB, name="bcast")
    t.validate()
    return t


def normalized(op: Op) -> dict:
    """An op's meaning: per-rank vectors expanded (a scalar and an all-equal vector are the same)."""
    out = {k: getattr(op, k) for k in ("id", "kind", "ranks", "name", "stream", "deps", "core", "coll",
                                        "comm", "buffer", "src", "dst", "peer_bytes", "fixed_time_s")}
    if op.kind != "compute":
        out.pop("core")
    for key in ("flops", "hbm_bytes"):
        out[key] = op.per_rank(getattr(op, key)).tolist()
    n = len(op.src) if op.kind == "p2p" else len(op.ranks)  # p2p bytes are per pair
    out["nbytes"] = list(op.nbytes) * n if len(op.nbytes) == 1 else list(op.nbytes)
    return out


def test_round_trip_keeps_ops_communicators_and_simulated_time(tmp_path, cm384) -> None:  # noqa: ANN001
    trace = rich_trace()
    files = export_chakra(trace, tmp_path, prefix="w")
    assert [f.name for f in files] == [f"w.{r}.et" for r in range(8)]
    back = import_chakra(tmp_path)
    assert back.world_size == 8 and back.communicators == trace.communicators
    assert back.meta == trace.meta and back.buffers == trace.buffers
    assert [normalized(o) for o in back.ops] == [normalized(o) for o in trace.ops]
    # same meaning = same simulation, to the last bit
    lib = make_library(cm384, "hccl")
    assert Replay(back, lib).run().makespan_s == Replay(trace, lib).run().makespan_s
    # and through parquet, as the CLI does
    back.save(tmp_path / "t.parquet")
    assert [normalized(o) for o in Trace.load(tmp_path / "t.parquet").ops] == [normalized(o) for o in trace.ops]


def test_what_other_tools_see(tmp_path) -> None:  # noqa: ANN001
    trace = rich_trace()
    export_chakra(trace, tmp_path)
    groups = json.loads((tmp_path / "trace.json").read_text())  # ASTRA-sim comm-group file
    assert groups == {"0": [0, 1, 2, 3], "1": [7, 6, 5, 4], "2": list(range(8))}
    meta, nodes = read_et(tmp_path / "trace.5.et")
    by_name = {n.name: n for n in nodes}
    attrs = {n.name: {a.name: getattr(a, a.WhichOneof("value")) for a in n.attr} for n in nodes}

    ar = by_name["tp_ar"]
    assert ar.type == pb.COMM_COLL_NODE
    assert attrs["tp_ar"]["comm_type"] == pb.ALL_REDUCE and attrs["tp_ar"]["comm_size"] == MiB
    assert attrs["tp_ar"]["pg_name"] == "1"  # rank 5 is in tp[1]
    assert list(ar.data_deps) == [by_name["attn"].id]  # explicit dep, same rank
    assert attrs["dispatch_v"]["comm_type"] == pb.ALL_TO_ALL and attrs["dispatch_v"]["pg_name"] == "2"
    assert attrs["bcast"]["comm_type"] == pb.BROADCAST

    comp = by_name["attn"]
    assert comp.type == pb.COMP_NODE and attrs["attn"]["num_ops"] == 1e12 + 5e9
    assert attrs["attn"]["tensor_size"] == 4 * MiB
    # per-rank stream order as ctrl deps: on rank 5's stream main, alltoallv -> the rank-5-only
    # compute -> allgather (the memcpy and the p2p ring are on other ranks / streams)
    assert list(by_name["waits_on_rank0"].ctrl_deps) == [by_name["dispatch_v"].id]
    assert list(by_name["ag_one_group"].ctrl_deps) == [by_name["waits_on_rank0"].id]

    # rank 5 sends pair 5 (5->6) and receives pair 4 (4->5) of the ring shift
    sr = [n for n in nodes if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)]
    got = sorted((n.type, *(getattr(a, a.WhichOneof("value")) for a in n.attr
                            if a.name in ("comm_src", "comm_dst", "comm_size"))) for n in sr)
    assert got == sorted([(pb.COMM_SEND_NODE, 5, 6, 6 * 4096), (pb.COMM_RECV_NODE, 4, 5, 5 * 4096)])
    # the cross-rank dependency (rank 5 waits for an op on rank 0) is not a Chakra edge
    assert list(by_name["waits_on_rank0"].data_deps) == []
    # every node id precedes its dependants in the file (readers stream the file)
    pos = {n.id: i for i, n in enumerate(nodes)}
    assert all(pos[d] < pos[n.id] for n in nodes for d in (*n.data_deps, *n.ctrl_deps))
    assert meta["schema"] == "stratacl-chakra-1"


def test_export_with_simulated_times(tmp_path, cm384) -> None:  # noqa: ANN001
    trace = rich_trace()
    res = Replay(trace, make_library(cm384, "stratacl")).run()
    export_chakra(trace, tmp_path, sim=res)
    _, nodes = read_et(tmp_path / "trace.0.et")
    ar = next(n for n in nodes if n.name == "tp_ar")
    assert ar.duration_micros == round((res.end[1] - res.start[1]) * 1e6) > 0
    assert ar.start_time_micros == round(res.start[1] * 1e6)


def _write_et(path: Path, nodes: list) -> None:
    with path.open("wb") as f:
        encodeMessage(f, pb.GlobalMetadata(version="0.0.4"))
        for n in nodes:
            encodeMessage(f, n)


def _node(nid: int, name: str, ntype: int, deps: tuple = (), **attrs: object) -> object:
    n = pb.Node(id=nid, name=name, type=ntype, data_deps=list(deps))
    for k, v in attrs.items():
        kw = {"string_val": v} if isinstance(v, str) else {"int64_val": v}
        n.attr.append(pb.AttributeProto(name=k, **kw))
    return n


def test_import_foreign_pytorch_style_trace(tmp_path) -> None:  # noqa: ANN001
    """Four ranks, two process groups, shared node ids (as the PyTorch converter writes them)."""
    (tmp_path / "et.json").write_text(json.dumps({"10": [0, 1], "11": [2, 3]}))
    for r in range(4):
        peer = r ^ 1
        nodes = [
            _node(1, "mm", pb.COMP_NODE, num_ops=10**9 * (r + 1), tensor_size=4096),
            _node(2, "nccl:all_reduce", pb.COMM_COLL_NODE, (1,), comm_type=pb.ALL_REDUCE,
                  comm_size=MiB, pg_name="10" if r < 2 else "11"),
            _node(3, "send" if r % 2 == 0 else "recv",
                  pb.COMM_SEND_NODE if r % 2 == 0 else pb.COMM_RECV_NODE, (2,),
                  comm_src=r if r % 2 == 0 else peer, comm_dst=peer if r % 2 == 0 else r,
                  comm_tag=7, comm_size=4096),
        ]
        nodes[0].duration_micros = 10 + r
        _write_et(tmp_path / f"et.{r}.et", nodes)
    t = import_chakra(tmp_path)
    kinds = [(o.kind, o.ranks) for o in t.ops]
    assert kinds.count(("compute", (0, 1, 2, 3))) == 1  # same id on every rank: one SPMD op
    mm = next(o for o in t.ops if o.kind == "compute")
    assert mm.flops == tuple(float(10**9 * (r + 1)) for r in range(4))
    assert mm.fixed_time_s == pytest.approx(13e-6)  # the slowest rank's measured time
    colls = [o for o in t.ops if o.kind == "collective"]
    assert sorted((o.comm, o.ranks) for o in colls) == [("pg[10]", (0, 1)), ("pg[11]", (2, 3))]
    assert all(o.coll == "allreduce" and o.nbytes == (MiB,) and o.deps == (mm.id,) for o in colls)
    p2p = sorted((o.src, o.dst, o.nbytes) for o in t.ops if o.kind == "p2p")
    assert p2p == [((0,), (1,), (4096.0,)), ((2,), (3,), (4096.0,))]
    assert t.communicators["pg[10]"] == (0, 1)


def test_import_chakra_generator_output(tmp_path, monkeypatch, cm384) -> None:  # noqa: ANN001
    """Files written by mlc-chakra's own generator import and simulate."""
    from chakra.src.generator import generator

    monkeypatch.chdir(tmp_path)
    generator.one_comm_coll_node_allreduce(4, 65536)
    generator.two_comp_nodes_dependent(4, 5)
    ar = import_chakra(tmp_path / "ALL_REDUCE")
    assert [(o.kind, o.coll, o.comm, o.ranks, o.nbytes) for o in ar.ops] == [
        ("collective", "allreduce", "world", (0, 1, 2, 3), (65536.0,))]
    comp = import_chakra(tmp_path / "two_comp_nodes_dependent")
    assert len(comp.ops) == 8 and all(o.fixed_time_s == pytest.approx(5e-6) for o in comp.ops)
    assert sum(1 for o in comp.ops if o.deps) == 4
    res = Replay(comp, make_library(cm384, "hccl")).run()
    assert res.makespan_s == pytest.approx(10e-6)  # two dependent 5 µs kernels per rank


def test_foreign_errors_name_the_node(tmp_path) -> None:  # noqa: ANN001
    for r in range(2):
        _write_et(tmp_path / f"bad.{r}.et", [_node(0, "my_reduce", pb.COMM_COLL_NODE, comm_type=pb.REDUCE,
                                                   comm_size=8)])
    with pytest.raises(TraceError, match="my_reduce.*REDUCE has no harness equivalent"):
        import_chakra(tmp_path)
    for r in range(2):
        _write_et(tmp_path / f"bad.{r}.et", [_node(0, "lonely", pb.COMP_NODE, (9,))])
    with pytest.raises(TraceError, match="'lonely' depends on unknown node 9"):
        import_chakra(tmp_path)


def test_cli_export_import(tmp_path) -> None:  # noqa: ANN001
    trace = rich_trace()
    trace.save(tmp_path / "in.parquet")
    run = [sys.executable, "-m", "stratacl.chakra"]
    exp = subprocess.run([*run, "export", str(tmp_path / "in.parquet"), str(tmp_path / "et")],
                         capture_output=True, text=True, timeout=60)
    assert exp.returncode == 0, exp.stderr
    assert len(list((tmp_path / "et").glob("trace.*.et"))) == 8
    imp = subprocess.run([*run, "import", str(tmp_path / "et"), str(tmp_path / "out.parquet")],
                         capture_output=True, text=True, timeout=60)
    assert imp.returncode == 0, imp.stderr
    assert "9 ops, 3 communicators, 8 ranks" in imp.stdout
    back = Trace.load(tmp_path / "out.parquet")
    assert [normalized(o) for o in back.ops] == [normalized(o) for o in trace.ops]
    bad = subprocess.run([*run, "import", str(tmp_path), str(tmp_path / "x.parquet")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected one set of <prefix>.<rank>.et files" in bad.stderr
