"""Export of harness traces as Chakra ET files (the format and its ASTRA-sim meaning:
`stratacl/chakra/import_et.py`'s docstring). Also the Chakra basics both directions share."""

from __future__ import annotations

import heapq
import json
import re
from collections import defaultdict
from dataclasses import fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from stratacl.errors import ConfigError
from stratacl.trace import Op, Trace, family_of, stream_predecessors
from stratacl.vocab import Collective, OpKind

SCHEMA = "stratacl-chakra-5"  # 5: + the trace's MoeShape and dispatch/combine (token, block) counts;
# 4: + kernel class and GEMM shapes; 3: + kernel format, vector FLOPs, block_dim, MoE mode, stream
# core limits
# schemas this import reads: 2 (ASTRA-sim's comm_size meaning, group ids from 1, stratacl_nbytes),
# 3 and 4 lack only the later optional attributes, which then take the Op / Trace defaults
READS = ("stratacl-chakra-2", "stratacl-chakra-3", "stratacl-chakra-4", SCHEMA)
INSTALL = 'pip install protobuf && pip install --no-deps "mlc-chakra>=1.0,<2"'
ET_VERSION = "1.0.0"
ET_FILE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.et$")
COLL_TO_CHAKRA = {"allreduce": "ALL_REDUCE", "allgather": "ALL_GATHER", "reducescatter": "REDUCE_SCATTER",
                   "alltoall": "ALL_TO_ALL", "alltoallv": "ALL_TO_ALL", "dispatch": "ALL_TO_ALL",
                   "combine": "ALL_TO_ALL", "broadcast": "BROADCAST"}
CHAKRA_TO_COLL = {"ALL_REDUCE": "allreduce", "ALL_GATHER": "allgather", "REDUCE_SCATTER": "reducescatter",
                   "REDUCE_SCATTER_BLOCK": "reducescatter", "ALL_TO_ALL": "alltoall",
                   "BROADCAST": "broadcast", "BARRIER": "allreduce"}



class OpTimes(Protocol):
    """Simulated per-op start / end times (s): a `SimResult`, or a run's saved `ReplayTimes`."""

    @property
    def start(self) -> np.ndarray: ...
    @property
    def end(self) -> np.ndarray: ...


def chakra_pb() -> tuple[Any, Any]:
    """(et_def_pb2, encode) from PyPI `mlc-chakra`, imported only when used (reading frames the
    messages itself)."""
    try:
        from chakra.schema.protobuf import et_def_pb2
        from chakra.src.third_party.utils.protolib import encodeMessage
    except ImportError as exc:
        raise ImportError(f"Chakra support needs the Chakra schema (PyPI mlc-chakra): {INSTALL}") from exc
    return et_def_pb2, encodeMessage


# --------------------------------------------------------------------------- attributes


def attr_int(value: object) -> int:
    """An attribute value as an integer (writers differ in the oneof type they pick)."""
    if isinstance(value, int | float | str | np.integer | np.floating):
        return int(value)
    raise TypeError(f"attribute value {value!r} is not a number")


def attr_float(value: object) -> float:
    if isinstance(value, int | float | str | np.integer | np.floating):
        return float(value)
    raise TypeError(f"attribute value {value!r} is not a number")


def attr_list(value: object) -> list[object]:
    """A list attribute's values (`node_attrs` gives *_list oneofs as lists)."""
    if isinstance(value, list | tuple):
        return list(value)
    raise TypeError(f"attribute value {value!r} is not a list")


def _attr(pb: Any, name: str, value: object) -> Any:
    if isinstance(value, bool):
        return pb.AttributeProto(name=name, bool_val=value)
    if isinstance(value, int | np.integer):
        return pb.AttributeProto(name=name, int64_val=int(value))
    if isinstance(value, float):
        return pb.AttributeProto(name=name, double_val=value)
    if isinstance(value, str):
        return pb.AttributeProto(name=name, string_val=value)
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return pb.AttributeProto(name=name, int64_list=pb.Int64List(values=value))
    if isinstance(value, tuple):
        return pb.AttributeProto(name=name, double_list=pb.DoubleList(values=value))
    raise TypeError(f"no Chakra attribute type for {name}={value!r}")


def node_attrs(node: Any) -> dict[str, object]:
    """Node attributes by name, whatever oneof type the writer chose."""
    out: dict[str, object] = {}
    for a in node.attr:
        kind = a.WhichOneof("value")
        if kind is None:
            continue
        v = getattr(a, kind)
        out[a.name] = list(v.values) if kind.endswith("_list") else v
    return out


# --------------------------------------------------------------------------- export


def export_chakra(trace: Trace, out_dir: str | Path, prefix: str = "trace",
                  sim: OpTimes | None = None) -> list[Path]:
    """Write `<out_dir>/<prefix>.<rank>.et` for every rank of the trace and `<prefix>.json`.

    `sim` (a `SimResult` of this trace, or anything with its per-op `start` / `end` arrays in
    seconds) adds simulated start times and durations. Ops without any work (no FLOPs, bytes or
    fixed time on any rank) are left out; their dependants inherit their dependencies.
    Returns the ET files written.
    """
    check_prefix(prefix)
    pb, encode = chakra_pb()
    trace.validate()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pg_id = pg_ids(trace.communicators)
    (out / f"{prefix}.json").write_text(json.dumps(
        {pg_id[n]: list(r) for n, r in trace.communicators.items()}) + "\n")

    base, nid = [], 0
    for op in trace.ops:  # global node ids: one per op, one per pair for p2p
        base.append(nid)
        nid += len(op.src) if op.kind == OpKind.p2p else 1
    order = topological(stream_predecessors(trace))  # keeps each rank's stream order
    dropped = {op.id for op in trace.ops if no_work(op)}
    per_rank: dict[int, list[Any]] = defaultdict(list)
    last: dict[tuple[int, str], int] = {}
    done: dict[tuple[int, int], list[int]] = {}  # (dropped op, rank) -> the nodes it stands for
    clock = _Carry()
    rank_sets = [set(op.ranks) for op in trace.ops]

    def finished(op_id: int, r: int) -> list[int]:  # the nodes whose end means op `op_id` ended on r
        return done[(op_id, r)] if op_id in dropped else _ids_on(trace.ops[op_id], base[op_id], r)

    for op in (trace.ops[i] for i in order):
        groups = _group_index(trace, op) if op.kind == OpKind.collective else {}
        for pos, r in enumerate(op.ranks):
            prev = last.get((r, op.stream))
            last[(r, op.stream)] = op.id
            data = [i for d in op.deps if r in rank_sets[d] for i in finished(d, r)]
            ctrl = finished(prev, r) if prev is not None else []
            if op.id in dropped:
                done[(op.id, r)] = list(dict.fromkeys(data + ctrl))
                continue
            for node in _nodes(pb, trace, op, base[op.id], r, pos, groups, pg_id, sim, clock):
                node.data_deps.extend(data)
                node.ctrl_deps.extend(c for c in ctrl if c not in data)
                per_rank[r].append(node)

    meta = [_attr(pb, "schema", SCHEMA), _attr(pb, "stratacl_world_size", trace.world_size),
            _attr(pb, "stratacl_communicators",
                  json.dumps({k: list(v) for k, v in trace.communicators.items()})),
            _attr(pb, "stratacl_meta", json.dumps(trace.meta, default=str)),
            _attr(pb, "stratacl_buffers", json.dumps(trace.buffers)),
            _attr(pb, "stratacl_stream_cores", json.dumps(trace.stream_cores))]
    if trace.moe is not None:
        meta.append(_attr(pb, "stratacl_moe", json.dumps(trace.moe.to_json())))
    if dropped:  # kept for the round trip only: other tools never see these ops
        meta.append(_attr(pb, "stratacl_dropped", json.dumps([op_fields(trace.ops[i]) for i in sorted(dropped)])))
    files = []
    for r in range(trace.world_size):  # ASTRA-sim opens one file per NPU and exits if one is missing
        path = out / f"{prefix}.{r}.et"
        with path.open("wb") as f:
            encode(f, pb.GlobalMetadata(version=ET_VERSION, attr=[*meta, _attr(pb, "stratacl_rank", r)]))
            for node in per_rank.get(r) or [_idle_node(pb, nid)]:
                encode(f, node)
        files.append(path)
    return files


def group_token_row(group_tokens: tuple[float, ...], n: int, idx: int) -> tuple[float, ...]:
    """Member `idx`'s rows of `Op.group_tokens` (one row of each n × n/g block matrix, g ascending)."""
    out: list[float] = []
    off = 0
    for g in (d for d in range(1, n + 1) if n % d == 0):
        w = n // g
        out += [float(v) for v in group_tokens[off + idx * w:off + (idx + 1) * w]]
        off += n * w
    return tuple(out)


def group_tokens_from_rows(rows: list[tuple[float, ...]]) -> tuple[float, ...]:
    """`Op.group_tokens` back from every member's `group_token_row`, in member order."""
    n = len(rows)
    out: list[float] = []
    off = 0
    for g in (d for d in range(1, n + 1) if n % d == 0):
        w = n // g
        for row in rows:
            out += [float(v) for v in row[off:off + w]]
        off += w
    return tuple(out)


def no_work(op: Op) -> bool:
    """A compute or memcpy op with nothing to do on any rank: it takes no time in the replay, and
    ASTRA-sim's roofline mode would skip it without issuing its dependants (`skip_invalid`)."""
    if op.kind == OpKind.compute:
        return op.fixed_time_s == 0 and not any((*op.flops, *op.vector_flops, *op.hbm_bytes))
    return op.kind == OpKind.memcpy and not any(op.nbytes)


def op_fields(op: Op) -> dict[str, object]:
    """An op as plain JSON values (tuples as lists)."""
    return {f.name: json.loads(json.dumps(getattr(op, f.name))) for f in fields(op)}


class _Carry:
    """Durations in whole µs (Chakra's `duration_micros`, which ASTRA-sim replays × 1000 ns) with the
    rounding error carried along each rank's stream: node i gets round(Tᵢ) − round(Tᵢ₋₁), Tᵢ the
    exact sum so far, so every run of consecutive kernels is within 1 µs of its exact time (plain
    rounding of 2.4 µs kernels would lose 17 %). The exact value rides in `stratacl_duration_s`."""

    def __init__(self) -> None:
        self.exact: dict[tuple[int, str], float] = defaultdict(float)
        self.written: dict[tuple[int, str], int] = defaultdict(int)

    def micros(self, rank: int, stream: str, seconds: float) -> int:
        key = (rank, stream)
        self.exact[key] += seconds * 1e6
        step = round(self.exact[key]) - self.written[key]
        self.written[key] += step
        return step


def check_prefix(prefix: str) -> str:
    """An export prefix must be a plain file name: the files go inside the output folder."""
    if (not prefix or prefix in (".", "..") or "/" in prefix or "\\" in prefix or "\0" in prefix
            or Path(prefix).name != prefix):
        raise ConfigError("prefix", f"{prefix!r} is not a plain file-name prefix (files must stay "
                          "inside the output folder)", "use a name without '/', '\\' or '..', e.g. trace")
    return prefix


def pg_ids(comms: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """Communicator name -> `pg_name`: 1, 2, … in trace order (ASTRA-sim reserves 0 for all ranks)."""
    return {name: str(i) for i, name in enumerate(comms, start=1)}


def _idle_node(pb: Any, node_id: int) -> Any:
    """A near-zero-time COMP node for a rank with no work: ASTRA-sim's feeder rejects a file without
    a dependency-free node; replay runs it for 1 ns, roofline mode for 1 op on 1 byte (a node with
    0 bytes it would skip without finishing the rank's graph)."""
    node = pb.Node(id=node_id, name="stratacl_idle", type=pb.COMP_NODE)
    node.attr.extend([pb.AttributeProto(name="is_cpu_op", bool_val=False),
                      pb.AttributeProto(name="num_ops", uint64_val=1),
                      pb.AttributeProto(name="tensor_size", uint64_val=1),
                      pb.AttributeProto(name="stratacl_idle", bool_val=True)])
    return node


def comm_size(op: Op, n: int) -> int:
    """`comm_size` of a collective for a member of an n-rank group, with ASTRA-sim's meaning
    (module docstring). The same on every member: ASTRA-sim matches messages by size."""
    size = max(op.nbytes)  # what the harness prices (LibraryRuntime._lower_collective)
    if op.coll == Collective.allgather:
        return round(size / n)  # ASTRA-sim: the per-rank input; nccl-tests S: the gathered output
    if op.peer_bytes and n > 1:  # uneven exchange -> uniform ALL_TO_ALL with the busiest member's volume
        m = np.asarray(op.peer_bytes, dtype=float).reshape(n, n)
        np.fill_diagonal(m, 0.0)
        return int(round(max(m.sum(axis=1).max(), m.sum(axis=0).max()) * n / (n - 1)))
    return round(size)


def harness_nbytes(coll: str, size: float, n: int) -> float:
    """Inverse of `comm_size` for a uniform collective: ASTRA-sim's comm_size -> nccl-tests bytes."""
    return size * n if coll == Collective.allgather else size


def topological(preds: list[list[int]]) -> list[int]:
    """Ops in an order where every predecessor comes first (Chakra readers expect deps earlier)."""
    indeg = [len(p) for p in preds]
    succ: list[list[int]] = [[] for _ in preds]
    for i, p in enumerate(preds):
        for j in p:
            succ[j].append(i)
    ready = [i for i, d in enumerate(indeg) if d == 0]  # a heap: lowest ready id first, deterministic
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    return order


def _ids_on(op: Op, base: int, rank: int) -> list[int]:
    if op.kind != OpKind.p2p:
        return [base]
    return [base + j for j, (s, d) in enumerate(zip(op.src, op.dst, strict=True)) if rank in (s, d)]


def _group_index(trace: Trace, op: Op) -> dict[int, tuple[str, int, int]]:
    """rank -> (communicator name, group-local index, group size) for a collective op."""
    out = {}
    op_ranks = set(op.ranks)
    for name, ranks in trace.communicators.items():
        named = name == op.comm or (op.comm not in trace.communicators and family_of(name) == op.comm)
        if named and op_ranks.issuperset(ranks):  # the same groups Trace.op_groups picks
            for i, r in enumerate(ranks):
                out[r] = (name, i, len(ranks))
    return out


def _nodes(pb: Any, trace: Trace, op: Op, base: int, r: int, pos: int,
           groups: dict[int, tuple[str, int, int]], pg_id: dict[str, str], sim: OpTimes | None,
           clock: _Carry) -> list[Any]:
    common = {"is_cpu_op": False, "stratacl_op": op.id, "stratacl_kind": op.kind,
              "stratacl_stream": op.stream, "stratacl_rank_pos": pos}
    if op.deps:
        common["stratacl_deps"] = tuple(op.deps)
    if op.buffer:
        common["stratacl_buffer"] = op.buffer
    if not op.name:
        common["stratacl_unnamed"] = True
    name = op.name or f"{op.kind}_{op.id}"
    specs: list[tuple[int, str, dict[str, object]]] = []  # (node id, node type, attributes)
    if op.kind in (OpKind.compute, OpKind.memcpy):
        if op.kind == OpKind.compute:
            a = _compute_attrs(op, pos)
        else:
            a = {"num_ops": 0, "tensor_size": round(2 * _at(op.nbytes, pos))}
        if op.fixed_time_s > 0:
            a["stratacl_fixed_time_s"] = float(op.fixed_time_s)
        _floor(a)
        specs.append((base, "COMP_NODE", a))
    elif op.kind == OpKind.collective:
        comm, idx, n = groups[r]
        a = {"comm_type": pb.CollectiveCommType.Value(COLL_TO_CHAKRA[op.coll]),
             "comm_size": comm_size(op, n), "pg_name": pg_id[comm],
             "stratacl_coll": op.coll, "stratacl_comm": op.comm, "stratacl_nbytes": _at(op.nbytes, pos)}
        if op.moe_mode:
            a["stratacl_moe_mode"] = op.moe_mode
        if op.peer_bytes:
            a["stratacl_peer_bytes"] = tuple(float(v) for v in op.peer_bytes[idx * n:(idx + 1) * n])
        if op.group_tokens:
            a["stratacl_group_tokens"] = group_token_row(op.group_tokens, n, idx)
        specs.append((base, "COMM_COLL_NODE", a))
    else:  # p2p: one node per pair end on this rank
        for j, (s, d) in enumerate(zip(op.src, op.dst, strict=True)):
            if r not in (s, d):
                continue
            a = {"comm_src": s, "comm_dst": d, "comm_tag": (base + j) % 2**31,
                 "comm_size": round(_at(op.nbytes, j)), "stratacl_pair": j}
            specs.append((base + j, "COMM_SEND_NODE" if r == s else "COMM_RECV_NODE", a))
    nodes = []
    for node_id, node_type, a in specs:
        node = pb.Node(id=node_id, name=name, type=pb.NodeType.Value(node_type))
        seconds = op.fixed_time_s if op.kind == OpKind.compute else 0.0
        if sim is not None:
            node.start_time_micros = round(float(sim.start[op.id]) * 1e6)
            seconds = float(sim.end[op.id] - sim.start[op.id])
        if node_type == "COMP_NODE":
            node.duration_micros = clock.micros(r, op.stream, seconds)
        else:
            node.duration_micros = round(seconds * 1e6)
        if seconds > 0:
            a["stratacl_duration_s"] = seconds
        for key, value in {**common, **a}.items():
            if key in ("comm_src", "comm_dst", "comm_tag"):  # ASTRA-sim reads these as int32
                node.attr.append(pb.AttributeProto(name=key, int32_val=attr_int(value)))
            elif key in ("num_ops", "tensor_size"):  # uint64 as Chakra's own generator writes them
                node.attr.append(pb.AttributeProto(name=key, uint64_val=attr_int(value)))
            else:
                node.attr.append(_attr(pb, key, value))
        nodes.append(node)
    return nodes


def _floor(a: dict[str, object]) -> None:
    """No COMP node with 0 operations or 0 bytes: ASTRA-sim's roofline mode skips a 0-byte node
    without issuing its dependants (a silent stall) and prices 0 operations at 0/0. A memcpy's 1
    operation on its bytes is memory-bound at the roofline's bandwidth, a kernel's 1 byte leaves
    it compute-bound; `stratacl_floored` names the raised fields so import restores the zeros."""
    raised = [k for k in ("num_ops", "tensor_size") if a[k] == 0]
    for k in raised:
        a[k] = 1
    if raised:
        a["stratacl_floored"] = ",".join(raised)


def _compute_attrs(op: Op, pos: int) -> dict[str, object]:
    """A compute node's fields. `num_ops` counts all its operations, the cube pipeline's and, for a
    mixed kernel, the vector pipeline's (each rounded, so import recovers the cube FLOPs as
    num_ops − round(vector FLOPs)); the split, the numeric format that picks the cube peak and the
    launch width have no Chakra field and ride in `stratacl_*` attributes, written only when set."""
    vf = _at(op.vector_flops, pos)
    a: dict[str, object] = {"num_ops": round(_at(op.flops, pos)) + round(vf),
                            "tensor_size": round(_at(op.hbm_bytes, pos)), "stratacl_core": op.core}
    if any(op.vector_flops):
        a["stratacl_vector_flops"] = vf  # exact; the node's share of num_ops is round(vf)
    if op.dtype:
        a["stratacl_dtype"] = op.dtype
    if op.block_dim:
        a["stratacl_block_dim"] = op.block_dim
    if op.kernel:
        a["stratacl_kernel"] = op.kernel
    if op.gemms:
        a["stratacl_gemms"] = tuple(int(x) for g in op.gemms for x in g)
    return a


def _at(values: tuple[float, ...], i: int) -> float:
    return float(values[0] if len(values) == 1 else values[i])
