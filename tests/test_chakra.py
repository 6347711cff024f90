"""Chakra ET export / import: round trip, what ASTRA-sim and other tools see, foreign traces, CLI.

`astra_sim_problems` is the test oracle: the rules ASTRA-sim (astra-sim/astra-sim, analytical
backend) and its ET feeder (astra-sim/chakra `src/feeder_v3`) apply to a workload, each citing the
source file that applies it. `ASTRA_BYTES_SENT` are the per-rank bytes its native collectives send
for a `comm_size` (Ring.cc, AllToAll.cc).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from helpers import chakra_or_skip, make_library

from stratacl.comm import algorithms as alg
from stratacl.comm.datapath import staging_bytes
from stratacl.config import MoeLlWindows
from stratacl.engine.replay import Replay
from stratacl.errors import ConfigError, TraceError
from stratacl.trace import MoeShape, Op, Trace
from workloads.common.routing import group_tokens

pb = chakra_or_skip()
from chakra.src.third_party.utils.protolib import decodeMessage, encodeMessage  # noqa: E402

from stratacl.chakra.import_et import SCHEMA, comm_size, export_chakra, import_chakra, read_et  # noqa: E402

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
    assert groups == {"1": [0, 1, 2, 3], "2": [7, 6, 5, 4], "3": list(range(8))}  # 0 = all ranks
    meta, nodes = read_et(tmp_path / "trace.5.et")
    by_name = {n.name: n for n in nodes}
    attrs = {n.name: {a.name: getattr(a, a.WhichOneof("value")) for a in n.attr} for n in nodes}

    ar = by_name["tp_ar"]
    assert ar.type == pb.COMM_COLL_NODE
    assert attrs["tp_ar"]["comm_type"] == pb.ALL_REDUCE and attrs["tp_ar"]["comm_size"] == MiB
    assert attrs["tp_ar"]["pg_name"] == "2"  # rank 5 is in tp[1]
    assert list(ar.data_deps) == [by_name["attn"].id]  # explicit dep, same rank
    assert attrs["dispatch_v"]["comm_type"] == pb.ALL_TO_ALL and attrs["dispatch_v"]["pg_name"] == "3"
    assert attrs["ag_one_group"]["comm_size"] == 2 * MiB // 4  # ASTRA-sim: per-rank input of 4 ranks
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
    assert meta["schema"] == SCHEMA
    assert astra_sim_problems(tmp_path, "trace", 8) == []


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


# --------------------------------------------------------------------------- ASTRA-sim's rules

ASTRA_COLLS = {pb.ALL_REDUCE: "ALL_REDUCE", pb.ALL_GATHER: "ALL_GATHER", pb.REDUCE_SCATTER: "REDUCE_SCATTER",
               pb.ALL_TO_ALL: "ALL_TO_ALL", pb.BROADCAST: "BROADCAST"}  # Workload.cc issue_coll_comm
ASTRA_BYTES_SENT = {  # per rank: steps × message size (Ring.cc constructor; AllToAll.cc for direct)
    "ALL_REDUCE": lambda size, n: 2 * (n - 1) * size / n,
    "ALL_GATHER": lambda size, n: (n - 1) * size,
    "REDUCE_SCATTER": lambda size, n: (n - 1) * size / n,
    "ALL_TO_ALL": lambda size, n: (n - 1) * size / n,
}
_INT_KINDS = {"int32_val", "int64_val", "uint32_val", "uint64_val", "sint32_val", "sint64_val",
              "fixed32_val", "fixed64_val", "sfixed32_val", "sfixed64_val"}


def _raw(node: object) -> dict[str, tuple[str, object]]:
    return {a.name: (a.WhichOneof("value"), getattr(a, a.WhichOneof("value"))) for a in node.attr}


def astra_sim_problems(folder: Path, prefix: str, world: int) -> list[str]:
    """What would stop ASTRA-sim running `<prefix>.<rank>.et` on `world` NPUs (empty: none)."""
    problems: list[str] = []
    groups = {int(k): v for k, v in json.loads((folder / f"{prefix}.json").read_text()).items()}
    problems += [f"comm group id {g}: CommunicatorGroup::set_id asserts id > 0" for g in groups if g <= 0]
    coll_seq: dict[int, dict[int, list]] = defaultdict(dict)  # group -> rank -> [(type, size)]
    sends: Counter = Counter()
    recvs: Counter = Counter()
    for r in range(world):
        f = folder / f"{prefix}.{r}.et"
        if not f.is_file():  # Workload::Workload exits
            problems.append(f"rank {r}: workload file missing")
            continue
        with f.open("rb") as fh:  # Chakra's own reader, not the module's
            meta, nodes = pb.GlobalMetadata(), []
            if not decodeMessage(fh, meta):  # ETFeeder: "Failed to read global metadata"
                problems.append(f"rank {r}: no global metadata")
                continue
            while decodeMessage(fh, node := pb.Node()):
                nodes.append(node)
        ids = {n.id for n in nodes}
        if len(ids) != len(nodes):
            problems.append(f"rank {r}: duplicate node ids")
        for n in nodes:  # ETFeeder::graph_sanity_check
            problems += [f"rank {r}: node {n.id} depends on {d}, not in the file"
                         for d in (*n.data_deps, *n.ctrl_deps) if d not in ids]
        order = _kahn(nodes)
        if not any(not n.data_deps and not n.ctrl_deps for n in nodes):  # dependancy_solver.cpp
            problems.append(f"rank {r}: no dependency-free node")
        elif len(order) != len(nodes):
            problems.append(f"rank {r}: dependency cycle")
        for n in order:
            a = _raw(n)
            is_comm = n.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)
            if is_comm and a.get("is_cpu_op", ("", False))[1]:
                problems.append(f"rank {r}: node {n.id}: comm node on CPU")
            for key in ("comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag", "num_ops", "tensor_size"):
                if key in a and a[key][0] not in _INT_KINDS:  # feeder: no float -> integer conversion
                    problems.append(f"rank {r}: node {n.id}: {key} is {a[key][0]}")
            if n.type == pb.COMM_COLL_NODE:
                if a["comm_type"][1] not in ASTRA_COLLS:
                    problems.append(f"rank {r}: node {n.id}: unsupported collective {a['comm_type'][1]}")
                pg = a.get("pg_name", ("", ""))[1]
                gid = 0 if pg in ("", "0") else int(pg)  # Workload::extract_comm_group
                members = list(range(world)) if gid == 0 else groups.get(gid)
                if members is None or r not in members:
                    problems.append(f"rank {r}: node {n.id}: not in comm group {pg!r}")
                    continue
                coll_seq[gid].setdefault(r, []).append((a["comm_type"][1], a["comm_size"][1]))
            elif n.type == pb.COMM_SEND_NODE:
                if a["comm_src"][1] != r:
                    problems.append(f"rank {r}: node {n.id}: send not issued by its sender")
                sends[(a["comm_src"][1], a["comm_dst"][1], a["comm_tag"][1], a["comm_size"][1])] += 1
            elif n.type == pb.COMM_RECV_NODE:
                if a["comm_dst"][1] != r:
                    problems.append(f"rank {r}: node {n.id}: recv not issued by its receiver")
                recvs[(a["comm_src"][1], a["comm_dst"][1], a["comm_tag"][1], a["comm_size"][1])] += 1
    for gid, seqs in coll_seq.items():  # sim_recv matches (tag, src, dst, size): members must agree
        members = list(range(world)) if gid == 0 else groups[gid]
        if any(seqs.get(m) != seqs.get(members[0]) for m in members):
            problems.append(f"comm group {gid}: members issue different collectives or sizes")
    if sends != recvs:
        problems.append(f"unmatched send/recv: {sorted((sends - recvs) + (recvs - sends))}")
    return problems


def _kahn(nodes: list) -> list:
    by_id = {n.id: n for n in nodes}
    indeg = {n.id: len(set(n.data_deps) | set(n.ctrl_deps)) for n in nodes}
    children = defaultdict(list)
    for n in nodes:
        for d in set(n.data_deps) | set(n.ctrl_deps):
            children[d].append(n.id)
    ready = sorted(i for i, d in indeg.items() if d == 0)
    out = []
    while ready:
        i = ready.pop(0)
        out.append(by_id[i])
        for c in children[i]:
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    return out


def coll_trace() -> Trace:
    """Every collective type on 4-rank groups of 9 ranks (rank 8 idle), sizes not divisible by 4,
    per-rank nbytes vectors, an uneven alltoallv, and a world collective over ranks 0..7."""
    t = Trace(world_size=9, moe=MoeShape(7168.0, 14336.0, 2, 8))
    t.add_family("tp", [[0, 1, 2, 3], [4, 5, 6, 7]])
    t.add_communicator("dp", range(8))
    t.collective("allreduce", "tp", MiB + 1, name="ar")
    t.collective("allgather", "tp", 3 * MiB + 2, name="ag")
    t.collective("reducescatter", "tp", 5 * MiB, name="rs")
    t.collective("alltoall", "tp", 2 * MiB, name="a2a")
    t.collective("allgather", "dp", [8 * MiB + 8 * i for i in range(8)], name="ag_vec")
    peers = [float(1000 * (i + 1) * (j != i) + 7 * j) for i in range(4) for j in range(4)]
    t.collective("alltoallv", "tp", 64 * 1024, peer_bytes=peers, name="a2av")
    t.collective("dispatch", "tp", 96 * 1024, name="disp")
    t.collective("broadcast", "dp", 4 * MiB, name="bc")
    t.validate()
    return t


def _coll_nodes(folder: Path, prefix: str, world: int) -> dict[str, dict[int, dict]]:
    """name -> rank -> attributes of that rank's collective node."""
    out: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in range(world):
        for n in read_et(folder / f"{prefix}.{r}.et")[1]:
            if n.type == pb.COMM_COLL_NODE:
                out[n.name][r] = {k: v for k, (_, v) in _raw(n).items()}
    return out


def test_comm_size_has_astra_sims_meaning(tmp_path, cm384) -> None:  # noqa: ANN001
    """comm_size = the per-rank input (ASTRA-sim), from the harness's nccl-tests S; and the bytes
    ASTRA-sim's ring / direct algorithms then send per rank equal what the harness's ring /
    full mesh sends for S."""
    trace = coll_trace()
    export_chakra(trace, tmp_path, prefix="c")
    assert astra_sim_problems(tmp_path, "c", 9) == []
    nodes = _coll_nodes(tmp_path, "c", 9)
    plane = make_library(cm384, "hccl").cfg.plane
    for op in trace.ops:
        n = 4 if op.comm == "tp" else 8
        S = max(op.nbytes)
        sizes = {a["comm_size"] for a in nodes[op.name].values()}
        assert len(sizes) == 1, f"{op.name}: members disagree on comm_size {sizes}"
        size = sizes.pop()
        assert sorted(nodes[op.name]) == list(op.ranks)
        if op.coll in ("allreduce", "allgather", "reducescatter", "alltoall"):
            assert size == round(staging_bytes(op.coll, S, n)[0]), op.name  # the per-rank input
        ctype = pb.CollectiveCommType.Name(nodes[op.name][op.ranks[0]]["comm_type"])
        tidx = cm384.group_tiers(tuple(range(n)))
        if op.coll in ("allreduce", "allgather", "reducescatter"):
            harness = alg.ring(op.coll, n, S, tidx, cm384, plane).send_bytes
            assert ASTRA_BYTES_SENT[ctype](size, n) == pytest.approx(harness, abs=n), op.name
        elif op.coll in ("alltoall", "alltoallv", "dispatch"):
            plan = alg.fullmesh(op.coll, n, S, tidx, cm384, plane, op.peer_bytes)
            busiest = max(plan.send_bytes, plan.recv_bytes)  # exact for uniform, bottleneck for v
            assert ASTRA_BYTES_SENT["ALL_TO_ALL"](size, n) == pytest.approx(busiest, abs=1), op.name
        else:
            assert ctype == "BROADCAST" and size == S  # ASTRA-sim replays it for duration_micros
    # all-gather: N× less than the gathered output, per rank; the exact harness bytes ride along
    ag = nodes["ag_vec"]
    assert {a["comm_size"] for a in ag.values()} == {round((8 * MiB + 56) / 8)}
    assert [ag[r]["stratacl_nbytes"] for r in range(8)] == [8 * MiB + 8 * i for i in range(8)]


def test_round_trip_of_every_collective_and_an_idle_rank(tmp_path, cm384) -> None:  # noqa: ANN001
    trace = coll_trace()
    files = export_chakra(trace, tmp_path)
    assert len(files) == 9  # rank 8 has no work but ASTRA-sim opens a file per NPU
    _, idle = read_et(tmp_path / "trace.8.et")
    assert [(n.type, n.duration_micros, n.data_deps, n.ctrl_deps) for n in idle] == [(pb.COMP_NODE, 0, [], [])]
    back = import_chakra(tmp_path)
    assert back.world_size == 9 and back.communicators == trace.communicators
    assert [normalized(o) for o in back.ops] == [normalized(o) for o in trace.ops]  # no op for the idle node
    lib = make_library(cm384, "stratacl")
    assert Replay(back, lib).run().makespan_s == Replay(trace, lib).run().makespan_s


def test_every_rank_file_is_one_astra_sim_accepts(tmp_path) -> None:  # noqa: ANN001
    """The oracle bites: a metadata-only file, a missing file, a group id 0, an all-gather whose
    members disagree are each reported."""
    t = Trace(world_size=4)
    t.add_communicator("pair", [0, 1])
    t.collective("allgather", "pair", 4096, name="ag")  # ranks 2 and 3 idle
    export_chakra(t, tmp_path)
    assert astra_sim_problems(tmp_path, "trace", 4) == []
    assert all(len(read_et(tmp_path / f"trace.{r}.et")[1]) == 1 for r in range(4))

    with (tmp_path / "trace.3.et").open("wb") as f:  # what the old export wrote for an idle rank
        encodeMessage(f, pb.GlobalMetadata(version="1.0.0"))
    assert astra_sim_problems(tmp_path, "trace", 4) == ["rank 3: no dependency-free node"]
    (tmp_path / "trace.3.et").unlink()
    assert astra_sim_problems(tmp_path, "trace", 4) == ["rank 3: workload file missing"]
    export_chakra(t, tmp_path)
    (tmp_path / "trace.json").write_text('{"0": [0, 1]}')
    assert "comm group id 0: CommunicatorGroup::set_id asserts id > 0" in astra_sim_problems(tmp_path, "trace", 4)
    export_chakra(t, tmp_path)
    _, nodes = read_et(tmp_path / "trace.1.et")
    for a in nodes[0].attr:
        if a.name == "comm_size":
            a.int64_val = 4096  # the old export: the gathered output on one member
    _write_et(tmp_path / "trace.1.et", nodes)
    assert astra_sim_problems(tmp_path, "trace", 4) == [
        "comm group 1: members issue different collectives or sizes"]


def _strip_harness_attrs(folder: Path, world: int) -> None:
    """What a tool without the `stratacl_*` attributes sees: only Chakra's standard fields."""
    for r in range(world):
        _, nodes = read_et(folder / f"trace.{r}.et")
        for n in nodes:
            keep = [a for a in n.attr if not a.name.startswith("stratacl_") or a.name == "stratacl_idle"]
            del n.attr[:]
            n.attr.extend(keep)
        _write_et(folder / f"trace.{r}.et", nodes)


def test_standard_fields_alone_carry_the_semantics(tmp_path) -> None:  # noqa: ANN001
    """Import with only Chakra's fields (the foreign path): comm_size read with ASTRA-sim's
    meaning gives back the harness's bytes; group ids ≥ 1 map back to the same ranks."""
    trace = coll_trace()
    export_chakra(trace, tmp_path)
    _strip_harness_attrs(tmp_path, 9)
    back = import_chakra(tmp_path)
    by_name: dict[str, list[Op]] = defaultdict(list)  # a family op comes back one op per group
    for o in back.ops:
        by_name[o.name].append(o)
    assert back.world_size == 9 and all(o.kind == "collective" for o in back.ops)
    for op in trace.ops:
        got = by_name[op.name]
        groups = [g for c, g in trace.communicators.items() if c == op.comm or c.startswith(op.comm + "[")]
        assert sorted(back.communicators[o.comm] for o in got) == sorted(groups), op.name
        assert sorted(r for o in got for r in o.ranks) == sorted(op.ranks)
        n = len(groups[0])
        if op.coll == "allgather":  # rounded per-rank input × group size
            want = round(max(op.nbytes) / n) * n
        elif op.peer_bytes:  # uneven exchange: the uniform equivalent
            want = comm_size(op, n)
        else:
            want = max(op.nbytes)
        coll = "alltoall" if op.coll in ("alltoallv", "dispatch") else op.coll
        assert {(o.coll, o.nbytes) for o in got} == {(coll, (float(want),))}, op.name
    assert {k: v for k, v in back.communicators.items()} == {
        "pg[1]": (0, 1, 2, 3), "pg[2]": (4, 5, 6, 7), "pg[3]": tuple(range(8))}


def test_group_ids_start_at_1_and_0_means_all_ranks(tmp_path) -> None:  # noqa: ANN001
    trace = rich_trace()
    export_chakra(trace, tmp_path)
    groups = json.loads((tmp_path / "trace.json").read_text())
    assert min(int(k) for k in groups) == 1
    for r in range(8):
        for n in read_et(tmp_path / f"trace.{r}.et")[1]:
            if n.type == pb.COMM_COLL_NODE:
                pg = _raw(n)["pg_name"][1]
                assert int(pg) >= 1 and r in groups[pg]

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "w.json").write_text(json.dumps({"1": [0, 1]}))
    for r in range(4):  # pg "0" on a node: all ranks (Workload::extract_comm_group)
        _write_et(foreign / f"w.{r}.et", [
            _node(1, "ar_all", pb.COMM_COLL_NODE, comm_type=pb.ALL_REDUCE, comm_size=MiB, pg_name="0"),
            _node(2, "ag_all", pb.COMM_COLL_NODE, (1,), comm_type=pb.ALL_GATHER, comm_size=MiB)])
    t = import_chakra(foreign)
    assert [(o.name, o.comm, o.ranks, o.coll, o.nbytes) for o in t.ops] == [
        ("ar_all", "world", (0, 1, 2, 3), "allreduce", (MiB,)),
        ("ag_all", "world", (0, 1, 2, 3), "allgather", (4 * MiB,))]  # 4 ranks × 1 MiB input
    (foreign / "w.json").write_text(json.dumps({"0": [0, 1]}))
    with pytest.raises(TraceError, match=r"w\.json: group id 0 is reserved for all ranks"):
        import_chakra(foreign)


@pytest.mark.parametrize("prefix", ["../../escape", "../x", "a/b", "/tmp/abs", "..", ".", "", "a\\b"])
def test_prefix_must_be_a_plain_file_name(tmp_path, prefix) -> None:  # noqa: ANN001
    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(ConfigError, match="prefix"):
        export_chakra(rich_trace(), out, prefix=prefix)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_cli_rejects_escaping_prefix_and_damaged_files(tmp_path) -> None:  # noqa: ANN001
    trace = rich_trace()
    trace.save(tmp_path / "in.parquet")
    run = [sys.executable, "-m", "stratacl.chakra"]
    before = sorted(tmp_path.rglob("*"))
    (tmp_path / "x" / "y").mkdir(parents=True)
    esc = subprocess.run([*run, "export", str(tmp_path / "in.parquet"), str(tmp_path / "x" / "y" / "out"),
                          "--prefix", "../../escape"], capture_output=True, text=True, timeout=60)
    assert esc.returncode == 2 and esc.stderr.count("\n") == 1 and "prefix" in esc.stderr
    assert sorted(tmp_path.rglob("*")) == sorted([*before, tmp_path / "x", tmp_path / "x" / "y"])

    et = tmp_path / "et"
    export_chakra(trace, et)
    good = (et / "trace.3.et").read_bytes()
    for damaged, why in [(b"not a chakra file at all", "record at byte 0 needs"),
                         (good[:-5], "truncated"),
                         (good[:2] + b"\xff" * (len(good) - 2), "")]:
        (et / "trace.3.et").write_bytes(damaged)
        with pytest.raises(TraceError, match=r"trace\.3\.et: .*" + why):
            import_chakra(et)
        bad = subprocess.run([*run, "import", str(et), str(tmp_path / "o.parquet")],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
        assert "trace.3.et" in bad.stderr and "Traceback" not in bad.stderr
    (et / "trace.3.et").write_bytes(good)
    assert import_chakra(et).ops
    missing = subprocess.run([*run, "import", str(tmp_path / "no" / "such" / "dir"), str(tmp_path / "o.parquet")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such directory" in missing.stderr
    assert missing.stderr.count("\n") == 1
    assert not (tmp_path / "o.parquet").exists()


def test_older_export_is_refused_not_misread(tmp_path) -> None:  # noqa: ANN001
    export_chakra(rich_trace(), tmp_path)
    for r in range(8):
        meta, nodes = read_et(tmp_path / f"trace.{r}.et")
        with (tmp_path / f"trace.{r}.et").open("wb") as f:
            encodeMessage(f, pb.GlobalMetadata(version="1.0.0", attr=[
                pb.AttributeProto(name="schema", string_val="stratacl-chakra-1")]))
            for n in nodes:
                encodeMessage(f, n)
    with pytest.raises(TraceError, match="older export.*export the trace again"):
        import_chakra(tmp_path)


# --------------------------------------------------------------------------- kernel fields


def kernel_trace() -> Trace:
    """Fields that price a kernel: a mixed kernel (per-rank vector FLOPs, limited stream), an int8
    matmul, a kernel launched on fewer cores, an LL dispatch; plus defaults, which write nothing."""
    t = Trace(world_size=4, moe=MoeShape(7168.0, 14336.0, 2, 8))
    t.add_communicator("ep", range(4))
    t.limit_stream("mb0", 8, 16)  # 8 AIC + 16 AIV: 8 complete core groups for mixed kernels
    t.limit_stream("mb1", 16, 32)
    a = t.compute(range(4), flops=4e12, hbm_bytes=64 * MiB, core="mixed", stream="mb0", name="fa",
                  vector_flops=[2e11, 2.5e11, 3e11, 3.5e11 + 0.25])  # a fraction: exact via the double
    d = t.collective("dispatch", "ep", MiB, moe_mode="ll", deps=[a], name="disp", stream="mb0")
    # one chain, so that every kernel's time is on the critical path
    t.compute(range(4), flops=8e12, hbm_bytes=16 * MiB, core="cube", dtype="int8", stream="mb1", name="mm8",
              deps=[d], kernel="grouped_gemm", gemms=((512, 4096, 7168, 2), (96, 7168, 2048, 1)))
    t.compute(range(4), flops=3e11, hbm_bytes=MiB, core="vector", block_dim=12, stream="mb1", name="norm",
              kernel="elementwise")
    t.compute(range(4), flops=1e12, hbm_bytes=MiB, name="plain")  # every new field at its default
    t.validate()
    return t


KERNEL_FIELDS = ("core", "vector_flops", "dtype", "block_dim", "moe_mode", "flops", "kernel", "gemms")


@pytest.mark.parametrize("field", [*KERNEL_FIELDS, "stream_cores"])
def test_round_trip_keeps_each_kernel_field(tmp_path, field) -> None:  # noqa: ANN001
    trace = kernel_trace()
    export_chakra(trace, tmp_path)
    back = import_chakra(tmp_path)
    if field == "stream_cores":
        assert back.stream_cores == trace.stream_cores == {"mb0": (8, 16), "mb1": (16, 32)}
        return
    want = [getattr(o, field) for o in trace.ops]
    got = [getattr(o, field) for o in back.ops]
    assert got == want, field
    assert len(set(map(str, want))) > 1, f"{field}: the trace must vary it for the test to bite"


def test_kernel_fields_use_chakras_fields_and_only_when_set(tmp_path) -> None:  # noqa: ANN001
    """num_ops counts the mixed kernel's vector work too; the namespaced attributes appear only on
    the nodes whose field differs from its default; every file stays one ASTRA-sim accepts."""
    trace = kernel_trace()
    export_chakra(trace, tmp_path)
    assert astra_sim_problems(tmp_path, "trace", 4) == []
    meta, nodes = read_et(tmp_path / "trace.3.et")
    assert json.loads(meta["stratacl_stream_cores"]) == {"mb0": [8, 16], "mb1": [16, 32]}
    attrs = {n.name: {k: v for k, (_, v) in _raw(n).items()} for n in nodes}
    assert attrs["fa"]["num_ops"] == 4e12 + round(3.5e11 + 0.25)
    assert attrs["fa"]["stratacl_vector_flops"] == 3.5e11 + 0.25
    assert attrs["mm8"]["stratacl_dtype"] == "int8" and attrs["norm"]["stratacl_block_dim"] == 12
    assert attrs["disp"]["stratacl_moe_mode"] == "ll"
    assert attrs["mm8"]["stratacl_kernel"] == "grouped_gemm" and attrs["norm"]["stratacl_kernel"] == "elementwise"
    assert list(attrs["mm8"]["stratacl_gemms"].values) == [512, 4096, 7168, 2, 96, 7168, 2048, 1]
    new = {"stratacl_vector_flops", "stratacl_dtype", "stratacl_block_dim", "stratacl_moe_mode",
           "stratacl_kernel", "stratacl_gemms"}
    assert new.isdisjoint(attrs["plain"]), attrs["plain"]
    assert {k for a in attrs.values() for k in a} >= new


def test_mixed_kernel_on_a_limited_stream_replays_the_same(tmp_path, cm384) -> None:  # noqa: ANN001
    """The round trip replays to the same time, and each carried field matters to that time: with
    any one of them dropped (what the previous export did) the replay differs."""
    trace = kernel_trace()
    export_chakra(trace, tmp_path)
    back = import_chakra(tmp_path)
    hccl = make_library(cm384, "hccl")  # keeps the stream split (stream_core_split: true)
    # the LL mode prices per-expert receive windows (HCCL's all-to-all-v lowering lands tokens per
    # peer, moe_ll_windows: per_peer; as per-expert slots each window costs it an SDMA start-up)
    per_expert = make_library(cm384, "hccl", moe_ll_windows=MoeLlWindows.per_expert)
    defaults = Op(id=0, kind="compute", ranks=(0,))
    for field in ("vector_flops", "dtype", "block_dim", "moe_mode", "stream_cores", "kernel", "gemms"):
        lib = per_expert if field == "moe_mode" else hccl
        t0 = Replay(trace, lib).run().makespan_s
        assert Replay(back, lib).run().makespan_s == t0
        lossy = import_chakra(tmp_path)
        if field == "stream_cores":
            lossy.stream_cores = {}
        else:
            for o in lossy.ops:
                setattr(o, field, getattr(defaults, field))
        assert Replay(lossy, lib).run().makespan_s != t0, f"dropping {field} does not change the replay"


def test_schema_2_file_loads_with_defaults() -> None:
    """tests/data/chakra_schema2: written by the previous export (fb5fda3, schema 2) from a trace
    with a mixed int8 kernel (vector FLOPs, block_dim 12) on a stream limited to 8 AIC + 16 AIV,
    all of which that export dropped. It still loads; the fields take their defaults."""
    folder = Path(__file__).parent / "data" / "chakra_schema2"
    assert read_et(folder / "old.0.et")[0]["schema"] == "stratacl-chakra-2"
    t = import_chakra(folder)
    assert t.stream_cores == {} and t.meta == {"workload": "schema2-fixture"}
    assert [(o.name, o.kind, o.core, o.flops, o.vector_flops, o.dtype, o.block_dim, o.moe_mode, o.kernel,
             o.gemms) for o in t.ops] == [
        ("fused_attn", "compute", "mixed", (4e12,), (0.0,), "", 0, "", "", ()),
        ("mm", "compute", "cube", (2e12,), (0.0,), "", 0, "", "", ()),
        ("ar", "collective", "cube", (0.0,), (0.0,), "", 0, "", "", ())]
    assert t.ops[2].deps == (0,) and t.ops[0].stream == "attn"


def test_round_trip_keeps_the_moe_shape_and_group_tokens(tmp_path) -> None:  # noqa: ANN001
    """An HT dispatch's (token, block) counts and the trace's MoeShape come back exactly, so the
    imported trace lowers on the same node-forwarding plan."""
    dest = np.random.default_rng(3).integers(0, 4, size=(4, 32, 2))  # (rank, token, k) -> destination rank
    gt = group_tokens(dest, 4)
    t = Trace(world_size=4, moe=MoeShape(7392.0, 14336.0, 2, 2))
    t.add_family("ep", [range(4)])
    t.collective("dispatch", "ep", MiB, peer_bytes=[[0, 1, 2, 3]] * 4, moe_mode="ht", group_tokens=gt, name="d")
    t.validate()
    export_chakra(t, tmp_path)
    back = import_chakra(tmp_path)
    assert back.moe == t.moe
    assert back.ops[0].group_tokens == tuple(float(x) for x in gt) and len(set(gt)) > 1
