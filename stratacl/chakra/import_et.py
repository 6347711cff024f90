"""Exchange traces with ASTRA-sim and other tools as MLCommons Chakra execution traces (ET).

Export writes one ET file per rank, `<prefix>.<rank>.et` (ASTRA-sim's `--workload-configuration`
naming), plus `<prefix>.json`, the communicator groups `{"<id>": [ranks]}` ASTRA-sim reads with
`--comm-group-configuration`. Needs the Chakra schema, installed without its analysis
dependencies (they pull JupyterLab): `pip install protobuf && pip install --no-deps "mlc-chakra>=1.0,<2"`.

What ASTRA-sim does with each field, read in its source (astra-sim/astra-sim at 518bd51, 2026-03;
its ET feeder is astra-sim/chakra `src/feeder_v3`), and what the harness writes there. The harness
`nbytes` of a collective follows nccl-tests (`stratacl/comm/library.py` `_IN_OUT`): all-gather S =
gathered output (input S/n per rank), reduce-scatter S = input (output S/n), others S = buffer.

| field | ASTRA-sim meaning (source) | export (import is the inverse) |
|---|---|---|
| ALL_REDUCE `comm_size` | per-rank buffer, in = out: ring msg size/n, 2(n−1) steps (`Ring.cc`) | S |
| ALL_GATHER `comm_size` | per-rank **input**: msg = size, output = size·n (`Ring.cc`, `HalvingDoubling.cc`) | S/n (n = the rank's group size) |
| REDUCE_SCATTER `comm_size` | per-rank **input**: msg = size/n, output = size/n (`Ring.cc`) | S |
| ALL_TO_ALL `comm_size` | per-rank send buffer, size/n to each member (`Ring.cc`, `AllToAll.cc`) | S; with `peer_bytes` the uniform equivalent n/(n−1)·(busiest member's off-diagonal send or receive bytes) |
| BROADCAST `comm_size` | unused: replayed for `duration_micros` (`Workload.cc` `issue_coll_comm`) | S (export with `sim` to give it a time) |
| `comm_size` on every member | receives match sends by (tag, src, dst, size) (`CommonNetworkApi.cc` `sim_recv`): all members must agree | the size the harness prices, from max(nbytes) (`LibraryRuntime._lower_collective`) |
| `pg_name` | id in the comm-group file; "" or "0" = all ranks (`Workload.cc` `extract_comm_group`) | communicators numbered 1, 2, … in trace order |
| comm-group file ids | must be > 0: 0 is reserved for all ranks (`CommunicatorGroup.cc` `set_id` asserts) | 1, 2, …; import reads "0" on a node as all ranks and rejects it in the file |
| SEND / RECV | issued by `comm_src` / `comm_dst` rank; `comm_size`, `comm_tag` as uint32 (`Workload.cc`) | one node per pair end, same size and tag on both |
| COMP `duration_micros` | replay time in whole µs (`issue_replay`: × 1000 ns, 0 → 1 ns); roofline mode uses `num_ops` / `tensor_size` instead (`issue_comp`) | the simulated time (a run's saved replay times, `sim`), else the fixed time; rounding carried along each rank's stream (below); exact seconds in `stratacl_duration_s` |
| COMP `num_ops`, `tensor_size` in roofline mode | `tensor_size` 0: `skip_invalid`, which finishes the node without issuing its dependants (the rank stalls silently); `num_ops` 0: time = 0 / roofline(0) (`Workload.cc` `issue_comp`, `Roofline.cc`) | never 0: ops without any work are left out (dependants inherit their deps); a memcpy's `num_ops` and a kernel's 0 bytes become 1 (`stratacl_floored` names them for import) |
| COMM nodes `is_cpu_op` | must be false (`Workload.cc` `issue_comm` throws) | false |
| SEND / RECV timing | a SEND's transfer starts when the sender issues it, whether or not the RECV is posted; the RECV ends at max(transfer end, its own issue) (`Workload.cc` `issue_send_comm`; analytical `CommonNetworkApi.cc` `sim_send` / `sim_recv`) | import: a p2p op waits for its SEND's deps only, a node after a RECV for the p2p op and the RECV's deps |
| the file | GlobalMetadata first, then nodes; needs ≥ 1 node without deps ("No dependancy free nodes found") and every dep in the same file (`et_feeder.cpp`, `dependancy_solver.cpp`); every rank's file must exist (`Workload.cc`) | a rank with no work gets one 1-op, 1-byte COMP node `stratacl_idle`; import names a missing rank file |

Run as well: ASTRA-sim's congestion-unaware analytical backend built from that source runs these
exports (8-NPU ring, α = 500 ns, 50 GB/s: an 8 MiB all-gather takes 140.30 µs against the α–β ring
7·(α + S/8/β) = 140.22 µs; with S as comm_size it took 1.097 ms), and rejects what the previous
export wrote (group id 0: `set_id` assertion; a node-less idle-rank file: "No dependancy free nodes").

Mapping (one harness op = one node per rank it runs on; p2p: one SEND/RECV node per pair end):

| harness op | Chakra node | standard attributes |
|---|---|---|
| compute | COMP_NODE | `num_ops` = FLOPs (cube + vector pipeline of a mixed kernel), `tensor_size` = HBM bytes, `duration_micros` |
| memcpy | COMP_NODE | `tensor_size` = 2·nbytes (read + write), `num_ops` = 1 (memory-bound in a roofline) |
| collective | COMM_COLL_NODE | `comm_type` (CollectiveCommType), `comm_size` (table above), `pg_name` |
| p2p pair | COMM_SEND_NODE / COMM_RECV_NODE | `comm_src`, `comm_dst`, `comm_tag`, `comm_size` |

`data_deps` hold the explicit dependencies that run on the same rank; `ctrl_deps` hold per-rank
stream order (the previous op on the same rank and stream). Node ids are global: an op's node has
the same id on every rank (a p2p op takes one id per pair). With simulated times (`sim`: a
`SimResult`, or a run's `traces/<name>.times.parquet`), every node also carries
`start_time_micros` / `duration_micros`. Chakra's durations are whole µs, so a COMP node gets
round(Tᵢ) − round(Tᵢ₋₁), Tᵢ the exact time of its rank's stream so far: any run of consecutive
kernels stays within 1 µs of its exact time (ten 2.4 µs kernels: 24 µs, not 20), and
`stratacl_duration_s` keeps the exact seconds.

Round trip: every node also carries `stratacl_*` attributes (op id, kind, stream, rank position,
all explicit deps, communicator family, exact per-rank nbytes, exact fixed time, alltoallv rows),
so `import_chakra` rebuilds the same ops and communicators. Fields Chakra has no standard attribute
for (ASTRA-sim's feeder reads only is_cpu_op, num_ops, tensor_loc, tensor_size, comm_type,
comm_priority, comm_size, comm_src, comm_dst, comm_tag, pg_name; `et_feeder_node` REGISTER_ATTR)
are namespaced and written only when they differ from the default, so a trace without them exports
as before:

| harness field | where | default on import when absent (e.g. a schema-2 or -3 file) |
|---|---|---|
| `core` (cube / vector / mixed) | node `stratacl_core` (string) | cube |
| `vector_flops` (mixed kernels) | node `stratacl_vector_flops` (double, per rank); also in `num_ops` | 0 |
| `dtype` (matmul format, picks the cube peak) | node `stratacl_dtype` (string) | "" (bf16) |
| `block_dim` (cores the kernel launches on) | node `stratacl_block_dim` (int64) | 0 (all) |
| `moe_mode` (dispatch / combine kernels) | node `stratacl_moe_mode` (string) | "" |
| `kernel` (kernel class, picks the kernel model) | node `stratacl_kernel` (string) | "" (generic; schema ≤ 3) |
| `gemms` (per-rank matmul shapes (m, n, k, count)) | node `stratacl_gemms` (int64 list, 4 per matmul) | () (schema ≤ 3) |
| `Trace.stream_cores` (per-stream AIC, AIV limits) | GlobalMetadata `stratacl_stream_cores` (JSON) | none |
| `Trace.moe` (the MoE layer's `MoeShape`) | GlobalMetadata `stratacl_moe` (JSON) | none (schema ≤ 4: a dispatch / combine then fails validation) |
| `group_tokens` (dispatch / combine (token, block) counts) | node `stratacl_group_tokens` (double list, the member's row of each block matrix) | () (schema ≤ 4) |

Documented losses:
- FLOPs, HBM bytes and per-pair p2p bytes are written as integers (rounded);
- per-rank vectors whose values are all equal come back as one value (same meaning, `Op.per_rank`);
- explicit dependencies on ops of *other* ranks cannot be expressed per rank in Chakra: they are
  kept in `stratacl_deps` for the round trip, but other tools see only same-rank `data_deps`;
- alltoallv / dispatch / combine become ALL_TO_ALL for other tools (`stratacl_coll` keeps them).
- ops without any work (no FLOPs, bytes or fixed time on any rank: they take no time in the
  replay) are not nodes; they travel in GlobalMetadata `stratacl_dropped` for the round trip.
ASTRA-sim's roofline mode prices a kernel by `num_ops` / `tensor_size`: fixed-time compute (0
FLOPs, 0 bytes, floored to 1 and 1) takes ~0 there; its time is meaningful in replay mode only.

Foreign traces (e.g. from Chakra's converter or ASTRA-sim's generators) import too: collectives
are matched across ranks by order of issue on their `pg_name` (no `pg_name` or "0": all ranks),
SEND/RECV by (src, dst, tag) in order, and COMP / MEM nodes with the same (id, type, name) on
several ranks merge into one SPMD op (their `duration_micros` becomes the op's minimum time, the
slowest rank's; `stratacl_duration_s` when present). `comm_size` is read with ASTRA-sim's
meaning (all-gather: × group size). SEND/RECV keep ASTRA-sim's eager-send timing (table above):
ASTRA-sim's custom-collective example (examples/system/custom_collectives, an MSCCL ring in which
every rank sends before it receives) imports; waiting for both ends would make that ring a cycle.
Streams: one `compute` stream per rank (devices run one kernel at a time), one stream per process
group for collectives (as NCCL does) and one per sender → receiver pair for p2p (a FIFO channel). REDUCE / GATHER / SCATTER have no harness
equivalent and fail with a message naming the node; BARRIER becomes a 0-byte allreduce.

CLI: `python -m stratacl.chakra export <run dir | trace.parquet> <outdir> [--prefix trace]
[--trace NAME] [--library LIB] [--no-times]` (a run directory saved with `output.trace=true`: each
trace into `<outdir>/<name>/`, with the simulated times of the run's baseline) and
`python -m stratacl.chakra import <dir-or-prefix> <trace.parquet>`; bad input (a prefix that is
not a plain file name, a missing or corrupt file, a missing rank file) prints one line and exits 2.
`workload=replay workload.trace=<dir-or-prefix>` simulates an imported set directly.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratacl.chakra.export import (  # noqa: F401 - SCHEMA, comm_size, export_chakra: the public API
    CHAKRA_TO_COLL,
    ET_FILE,
    READS,
    SCHEMA,
    attr_float,
    attr_int,
    attr_list,
    chakra_pb,
    check_prefix,
    comm_size,
    export_chakra,
    group_tokens_from_rows,
    harness_nbytes,
    node_attrs,
    pg_ids,
    topological,
)
from stratacl.errors import HarnessError, TraceError
from stratacl.run_traces import replay_times, saved_traces
from stratacl.trace import MoeShape, Op, Trace
from stratacl.vocab import CoreKind, OpKind

# --------------------------------------------------------------------------- import


def et_files(path: str | Path) -> dict[int, Path]:
    """rank -> ET file, from a directory holding one `<prefix>.<rank>.et` set or a path prefix."""
    path = Path(path)
    if path.is_dir():
        candidates, prefix = list(path.glob("*.et")), None
    elif not path.parent.is_dir():
        raise TraceError(f"{path.parent}: no such directory")
    else:
        candidates, prefix = list(path.parent.glob(f"{path.name}.*.et")), path.name
    sets: dict[str, dict[int, Path]] = defaultdict(dict)
    for f in candidates:
        m = ET_FILE.match(f.name)
        if m and (prefix is None or m["prefix"] == prefix):
            sets[m["prefix"]][int(m["rank"])] = f
    if len(sets) != 1:
        found = sorted(sets) or "none"
        raise TraceError(f"{path}: expected one set of <prefix>.<rank>.et files, found prefixes {found}")
    return dict(sorted(next(iter(sets.values())).items()))


def read_et(path: Path) -> tuple[dict[str, object], list[Any]]:
    """(global metadata attributes, nodes in file order) of one ET file; a damaged file is a
    TraceError naming it (Chakra's own reader would stop silently at the damage)."""
    pb = chakra_pb()[0]
    from google.protobuf.message import DecodeError

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    messages = list(_framed(data, path))
    if not messages:
        raise TraceError(f"{path}: empty file, not a Chakra ET file (no global metadata)")
    out = []
    for i, (offset, buf) in enumerate(messages):
        msg = pb.GlobalMetadata() if i == 0 else pb.Node()
        try:
            msg.ParseFromString(buf)
        except DecodeError as exc:
            what = "global metadata" if i == 0 else f"node record {i}"
            raise TraceError(f"{path}: not a valid Chakra ET file ({what} at byte {offset} does not "
                             f"decode: {exc})") from None
        out.append(msg)
    return node_attrs(out[0]), out[1:]


def _framed(data: bytes, path: Path) -> Iterable[tuple[int, bytes]]:
    """(offset, payload) of each varint-length-prefixed message (Chakra's `encodeMessage` framing)."""
    pos = 0
    while pos < len(data):
        start, size, shift = pos, 0, 0
        while True:
            if pos >= len(data) or shift > 28:  # a varint32 has at most 5 bytes
                raise TraceError(f"{path}: not a valid Chakra ET file (bad record length at byte {start})")
            b = data[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if pos + size > len(data):
            raise TraceError(f"{path}: not a valid Chakra ET file (record at byte {start} needs {size} "
                             f"bytes, {len(data) - pos} left: truncated?)")
        yield start, data[pos:pos + size]
        pos += size


def import_chakra(path: str | Path, merge: bool = True) -> Trace:
    """Read a set of per-rank Chakra ET files (a directory or a `<dir>/<prefix>` path) into a Trace.

    `merge=False` keeps foreign COMP/MEM nodes one op per rank (use it when merging equal-looking
    nodes of different ranks is wrong for a trace; the import retries that way on a cycle).
    """
    files = et_files(path)
    ranks = {r: read_et(f) for r, f in files.items()}
    meta = next(iter(ranks.values()))[0]
    schema = str(meta.get("schema", ""))
    if schema.startswith("stratacl-chakra-") and schema not in READS:
        raise TraceError(f"{next(iter(files.values()))}: written by an older export ({schema}: other "
                         f"comm_size meaning and group ids); export the trace again")
    if schema in READS:
        _check_rank_files(files, attr_int(meta.get("stratacl_world_size", 0)))
        trace = _import_own(meta, {r: nodes for r, (_, nodes) in ranks.items()})
    else:
        groups = _comm_groups(next(iter(files.values())))
        _check_rank_files(files, max([*files, *(r for g in groups.values() for r in g), *_peers(ranks)]) + 1)
        try:
            trace = _import_foreign({r: nodes for r, (_, nodes) in ranks.items()}, groups, merge)
        except TraceError as exc:
            if not merge or "cycle" not in str(exc):
                raise
            trace = _import_foreign({r: nodes for r, (_, nodes) in ranks.items()}, groups, False)
    trace.validate()
    return trace


def _check_rank_files(files: dict[int, Path], world: int) -> None:
    """Every rank 0..world−1 needs its file (as ASTRA-sim requires); name the first missing one."""
    missing = [r for r in range(world) if r not in files]
    if missing:
        some = next(iter(files.values()))
        m = ET_FILE.match(some.name)  # et_files only lists names that match
        prefix = m["prefix"] if m else some.name
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise TraceError(f"rank file {some.parent / f'{prefix}.{missing[0]}.et'} is missing{more}: the set "
                         f"has ranks {_spans(sorted(files))} of {world}")


def _spans(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], ranks[0]
    for a, b in zip(ranks, [*ranks[1:], None], strict=True):
        if b != a + 1:
            out.append(f"{start}-{a}" if a > start else f"{a}")
            if b is not None:
                start = b
    return ", ".join(out)


def _peers(ranks: dict[int, tuple[dict[str, object], list[Any]]]) -> Iterable[int]:
    """Ranks that SEND / RECV nodes name as their peer."""
    for _, nodes in ranks.values():
        for node in nodes:
            for a in node.attr:
                if a.name in ("comm_src", "comm_dst"):
                    yield int(getattr(a, a.WhichOneof("value") or "int32_val"))


def _comm_groups(et_file: Path) -> dict[str, tuple[int, ...]]:
    m = ET_FILE.match(et_file.name)
    group_file = et_file.parent / f"{m['prefix']}.json" if m else None
    if group_file is None or not group_file.is_file():
        return {}
    try:
        groups = {str(k): tuple(int(r) for r in v) for k, v in json.loads(group_file.read_text()).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise TraceError(f"{group_file}: not a comm-group file {{\"<id>\": [ranks]}} ({exc})") from None
    if "0" in groups:  # ASTRA-sim: CommunicatorGroup::set_id asserts id > 0
        raise TraceError(f"{group_file}: group id 0 is reserved for all ranks; number groups from 1")
    return groups


def _moe_shape(meta: dict[str, object]) -> MoeShape | None:
    """The export's MoeShape (schema ≥ 5); a malformed one raises TraceError."""
    if "stratacl_moe" not in meta:
        return None
    try:
        return MoeShape.from_json(json.loads(str(meta["stratacl_moe"])))
    except (KeyError, ValueError, TypeError) as exc:
        raise TraceError(f"stratacl_moe metadata is malformed: {exc}") from None


def _import_own(meta: dict[str, object], nodes_by_rank: dict[int, list[Any]]) -> Trace:
    """Rebuild a harness export from its `stratacl_*` attributes (ops keep their ids)."""
    comms = {k: tuple(v) for k, v in json.loads(str(meta["stratacl_communicators"])).items()}
    trace = Trace(world_size=attr_int(meta["stratacl_world_size"]), communicators=comms,
                  meta=json.loads(str(meta.get("stratacl_meta", "{}"))),
                  buffers={k: _allocs(v) for k, v in json.loads(str(meta.get("stratacl_buffers", "{}"))).items()},
                  stream_cores={k: (int(v[0]), int(v[1]))
                                for k, v in json.loads(str(meta.get("stratacl_stream_cores", "{}"))).items()},
                  moe=_moe_shape(meta))
    by_op: dict[int, list[tuple[int, Any, dict[str, object]]]] = defaultdict(list)
    for r, nodes in nodes_by_rank.items():
        for node in nodes:
            a = node_attrs(node)
            if not a.get("stratacl_idle"):
                by_op[attr_int(a["stratacl_op"])].append((r, node, a))
    dropped = {int(d["id"]): d for d in json.loads(str(meta.get("stratacl_dropped", "[]")))}
    n_ops = len(by_op) + len(dropped)
    if sorted([*by_op, *dropped]) != list(range(n_ops)):
        raise TraceError("Chakra export is incomplete: op ids are not 0..n-1")
    for op_id in range(n_ops):
        if op_id in dropped:  # an op without work: export left it out of the ranks' files
            trace.add(**{k: v for k, v in dropped[op_id].items() if k != "id"})
            continue
        members = by_op[op_id]
        node, a = members[0][1], members[0][2]
        pos = {r: attr_int(x["stratacl_rank_pos"]) for r, _, x in members}
        op_ranks = tuple(sorted(pos, key=pos.__getitem__))
        first = {r: _unfloored(x) for r, _, x in reversed(members)}  # p2p: any node of the rank will do
        kind = str(a["stratacl_kind"])
        op = Op(id=op_id, kind=kind, ranks=op_ranks, name="" if a.get("stratacl_unnamed") else node.name,
                stream=str(a["stratacl_stream"]), deps=tuple(attr_int(d) for d in attr_list(a.get("stratacl_deps", []))),
                buffer=str(a.get("stratacl_buffer", "")), fixed_time_s=attr_float(a.get("stratacl_fixed_time_s", 0.0)))
        if kind == OpKind.compute:
            vf = [attr_float(first[r].get("stratacl_vector_flops", 0.0)) for r in op_ranks]
            op.flops = _vec([attr_float(first[r]["num_ops"]) - round(v) for r, v in zip(op_ranks, vf, strict=True)])
            op.vector_flops = _vec(vf)
            op.hbm_bytes = _vec([first[r]["tensor_size"] for r in op_ranks])
            op.core = str(a["stratacl_core"])
            op.dtype = str(a.get("stratacl_dtype", ""))
            op.block_dim = attr_int(a.get("stratacl_block_dim", 0))
            op.kernel = str(a.get("stratacl_kernel", ""))
            flat = [attr_int(x) for x in attr_list(a.get("stratacl_gemms", []))]
            if len(flat) % 4:
                raise TraceError(f"op {op_id}: stratacl_gemms has {len(flat)} values, not 4 per matmul")
            op.gemms = tuple((flat[i], flat[i + 1], flat[i + 2], flat[i + 3]) for i in range(0, len(flat), 4))
        elif kind == OpKind.memcpy:
            op.nbytes = _vec([attr_float(first[r]["tensor_size"]) / 2 for r in op_ranks])
        elif kind == OpKind.collective:
            op.coll, op.comm = str(a["stratacl_coll"]), str(a["stratacl_comm"])
            op.moe_mode = str(a.get("stratacl_moe_mode", ""))
            op.nbytes = _vec([first[r]["stratacl_nbytes"] for r in op_ranks])
            if "stratacl_peer_bytes" in a:  # one group's rows make the shared group-local matrix
                pg = comms_by_pg(comms)[str(a["pg_name"])]
                op.peer_bytes = tuple(attr_float(v) for r in pg for v in attr_list(first[r]["stratacl_peer_bytes"]))
            if "stratacl_group_tokens" in a:  # as peer_bytes: one group's rows
                pg = comms_by_pg(comms)[str(a["pg_name"])]
                op.group_tokens = trace.share(group_tokens_from_rows(
                    [tuple(attr_float(v) for v in attr_list(first[r]["stratacl_group_tokens"])) for r in pg]))
        else:
            pairs = sorted((attr_int(x["stratacl_pair"]), attr_int(x["comm_src"]), attr_int(x["comm_dst"]),
                            attr_float(x["comm_size"]))
                           for _, n, x in members if n.type == chakra_pb()[0].COMM_SEND_NODE)
            op.src = tuple(p[1] for p in pairs)
            op.dst = tuple(p[2] for p in pairs)
            op.nbytes = _vec([p[3] for p in pairs])
        trace.ops.append(op)
    return trace


def _unfloored(a: dict[str, object]) -> dict[str, object]:
    """Undo export's `_floor`: fields it raised from 0 to 1 for ASTRA-sim's roofline mode."""
    for key in str(a.get("stratacl_floored", "")).split(","):
        if key:
            a[key] = 0
    return a


def _allocs(value: object) -> tuple[int, ...]:
    """Buffer allocation ops: a list of op ids (older traces: one id)."""
    return tuple(attr_int(v) for v in value) if isinstance(value, list) else (attr_int(value),)


def comms_by_pg(comms: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """pg_name -> ranks, the inverse of export's numbering (`pg_ids`)."""
    return {pg: comms[name] for name, pg in pg_ids(comms).items()}


def _vec(values: Iterable[object]) -> tuple[float, ...]:
    vals = tuple(attr_float(v) for v in values)
    return vals[:1] if vals and all(v == vals[0] for v in vals) else vals


@dataclass(frozen=True, slots=True)
class _Coll:
    """The k-th collective issued on process group `pg` ("" = all ranks): one op on all members."""

    pg: str
    k: int


@dataclass(frozen=True, slots=True)
class _P2p:
    """The k-th SEND / RECV pair src -> dst with `tag`."""

    src: int
    dst: int
    tag: int
    k: int


@dataclass(frozen=True, slots=True)
class _Node:
    """A COMP / MEM node: merged across ranks by (id, type, name), or one rank's (`rank`)."""

    id: int
    type: int
    name: str
    rank: int | None


_OpKey = _Coll | _P2p | _Node
_Member = tuple[int, Any, dict[str, object]]  # (rank, Chakra node, its attributes)


def _import_foreign(nodes_by_rank: dict[int, list[Any]], pg_ranks: dict[str, tuple[int, ...]],
                    merge: bool) -> Trace:
    pb = chakra_pb()[0]
    world = max(nodes_by_rank) + 1
    key_of: dict[tuple[int, int], _OpKey] = {}  # (rank, node id) -> op key
    members: dict[_OpKey, list[_Member]] = defaultdict(list)
    for r, nodes in nodes_by_rank.items():
        seen: dict[tuple[str | int | bool, ...], int] = defaultdict(int)  # issued per group / pair end
        for node in nodes:
            a = node_attrs(node)
            if a.get("stratacl_idle"):  # placeholder of a rank with no work (export)
                continue
            key = _foreign_key(pb, r, node, a, seen, merge)
            if (r, node.id) in key_of:
                raise TraceError(f"rank {r}: Chakra node id {node.id} appears twice")
            key_of[(r, node.id)] = key
            members[key].append((r, node, a))
    preds = _foreign_preds(pb, members, key_of, {(r, n.id): n for r, nodes in nodes_by_rank.items() for n in nodes})
    order = _foreign_order(members, preds)
    index = {k: i for i, k in enumerate(order)}
    trace = Trace(world_size=world, meta={"source": "chakra"})
    for pg, ranks in sorted(pg_ranks.items()):
        trace.add_communicator(f"pg[{pg}]", ranks)
    for key in order:
        deps = tuple(sorted(index[p] for p in preds[key]))
        trace.ops.append(_foreign_op(pb, trace, index[key], key, members[key], deps, world))
    return trace


def _foreign_key(pb: Any, r: int, node: Any, a: dict[str, object], seen: dict[tuple[str | int | bool, ...], int],
                 merge: bool) -> _OpKey:
    t = node.type
    if t == pb.COMM_COLL_NODE:
        pg = str(a.get("pg_name", ""))
        pg = "" if pg == "0" else pg  # ASTRA-sim: "" and "0" both mean all ranks
        k = seen[("coll", pg)]
        seen[("coll", pg)] += 1
        return _Coll(pg, k)
    if t in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
        src = attr_int(a.get("comm_src", r if t == pb.COMM_SEND_NODE else -1))
        dst = attr_int(a.get("comm_dst", r if t == pb.COMM_RECV_NODE else -1))
        if src < 0 or dst < 0:
            raise TraceError(f"rank {r}: Chakra node {node.id} '{node.name}' lacks comm_src/comm_dst")
        tag = attr_int(a.get("comm_tag", 0))
        end = ("p2p", src, dst, tag, t == pb.COMM_SEND_NODE)
        k = seen[end]
        seen[end] += 1
        return _P2p(src, dst, tag, k)
    return _Node(node.id, t, node.name, None if merge else r)


def _foreign_preds(pb: Any, members: dict[_OpKey, list[_Member]], key_of: dict[tuple[int, int], _OpKey],
                   nodes: dict[tuple[int, int], Any]) -> dict[_OpKey, set[_OpKey]]:
    """The ops each op waits for, with ASTRA-sim's point-to-point semantics (`Workload.cc`
    `issue_send_comm`, analytical `CommonNetworkApi.cc` `sim_send` / `sim_recv`): a SEND starts
    its transfer when the sender's dependencies are done, whether or not the receiver has posted
    its RECV; a RECV ends when both the transfer and its own dependencies have. So a p2p op waits
    only for its SEND node's dependencies, and a node after a RECV waits for the p2p op and for the
    RECV's dependencies. (Waiting for both ends, as before, turns a ring in which every rank sends
    before it receives — MSCCL-style custom collectives — into a dependency cycle.)"""
    expanded: dict[tuple[int, int], set[_OpKey]] = {}

    def after(r: int, node: Any) -> set[_OpKey]:  # ops that end before `node` may start on rank r
        out: set[_OpKey] = set()
        for d in (*node.data_deps, *node.ctrl_deps):
            dep = key_of.get((r, d))
            if dep is None:
                raise TraceError(f"rank {r}: Chakra node {node.id} '{node.name}' depends on unknown node {d}")
            out.add(dep)
            if nodes[(r, d)].type == pb.COMM_RECV_NODE:
                if (r, d) not in expanded:
                    expanded[(r, d)] = set()  # a cycle through RECVs ends here; the order check names it
                    expanded[(r, d)] = after(r, nodes[(r, d)])
                out |= expanded[(r, d)]
        return out

    for (r, nid), node in nodes.items():  # file order: a RECV's earlier RECVs are ready (no deep recursion)
        if node.type == pb.COMM_RECV_NODE and (r, nid) not in expanded and (r, nid) in key_of:
            expanded[(r, nid)] = set()
            expanded[(r, nid)] = after(r, node)
    preds: dict[_OpKey, set[_OpKey]] = {}
    for key, ms in members.items():
        waiting = [m for m in ms if not isinstance(key, _P2p) or m[1].type == pb.COMM_SEND_NODE]
        preds[key] = set[_OpKey]().union(*(after(r, node) for r, node, _ in waiting)) - {key}
    return preds


def _foreign_order(members: dict[_OpKey, list[_Member]], preds: dict[_OpKey, set[_OpKey]]) -> list[_OpKey]:
    keys = list(members)
    idx = {k: i for i, k in enumerate(keys)}
    order = topological([sorted(idx[p] for p in preds[k]) for k in keys])
    if len(order) != len(keys):
        stuck = next(k for k in keys if idx[k] not in set(order))
        r, node, _ = members[stuck][0]
        raise TraceError(f"rank {r}: Chakra node {node.id} '{node.name}' is on a dependency cycle "
                         "after matching nodes across ranks")
    return [keys[i] for i in order]


def _foreign_op(pb: Any, trace: Trace, op_id: int, key: _OpKey, ms: list[_Member], deps: tuple[int, ...],
                world: int) -> Op:
    ms = sorted(ms, key=lambda m: m[0])
    r0, node0, a0 = ms[0]
    ranks = tuple(r for r, _, _ in ms)
    where = f"rank {r0}: Chakra node {node0.id} '{node0.name}'"
    if isinstance(key, _Coll):
        ctype = pb.CollectiveCommType.Name(attr_int(a0.get("comm_type", 0)))
        if ctype not in CHAKRA_TO_COLL:
            raise TraceError(f"{where}: collective {ctype} has no harness equivalent "
                             f"(supported: {sorted(CHAKRA_TO_COLL)})")
        pg = key.pg
        comm = f"pg[{pg}]" if pg else "world"
        if comm not in trace.communicators:
            trace.add_communicator(comm, ranks if pg else range(world))
        n, coll = len(trace.communicators[comm]), CHAKRA_TO_COLL[ctype]
        nbytes = [0.0 if ctype == "BARRIER" else harness_nbytes(coll, attr_float(a.get("comm_size", 0)), n)
                  for _, _, a in ms]
        return Op(id=op_id, kind=OpKind.collective.value, ranks=ranks, name=node0.name, stream=f"comm:{pg or 'world'}",
                  deps=deps, coll=coll, comm=comm, nbytes=_vec(nbytes))
    if isinstance(key, _P2p):
        sends = [m for m in ms if m[1].type == pb.COMM_SEND_NODE]
        if len(sends) != 1 or len(ms) != 2:
            raise TraceError(f"{where}: SEND {key.src}->{key.dst} tag {key.tag} has no matching RECV")
        size = attr_float(sends[0][2].get("comm_size", 0))
        return Op(id=op_id, kind=OpKind.p2p.value, ranks=(key.src, key.dst), name=node0.name,  # one FIFO per pair
                  stream=f"p2p:{key.src}->{key.dst}", deps=deps, src=(key.src,), dst=(key.dst,), nbytes=(size,))
    fixed = max(attr_float(a.get("stratacl_duration_s", n.duration_micros * 1e-6)) for _, n, a in ms)
    if node0.type in (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE):
        return Op(id=op_id, kind=OpKind.memcpy.value, ranks=ranks, name=node0.name, stream="compute", deps=deps,
                  nbytes=_vec(a.get("tensor_size", 0) for _, _, a in ms))
    return Op(id=op_id, kind=OpKind.compute.value, ranks=ranks, name=node0.name, stream="compute", deps=deps,
              flops=_vec(a.get("num_ops", 0) for _, _, a in ms),
              hbm_bytes=_vec(a.get("tensor_size", 0) for _, _, a in ms),
              core=str(a0.get("stratacl_core", CoreKind.cube.value)), fixed_time_s=fixed)


# --------------------------------------------------------------------------- CLI


def _export_cli(args: argparse.Namespace) -> None:
    check_prefix(args.prefix)
    sources = saved_traces(args.trace, args.name)
    for src in sources:
        out = args.outdir / src.stem if args.trace.is_dir() else args.outdir
        times = None if args.no_times else replay_times(src, args.library)
        files = export_chakra(Trace.load(src), out, args.prefix, sim=times)
        how = (f"compute times of {times.library}'s replay" if times else
               "no simulated times (--no-times)" if args.no_times else
               f"no simulated times: no {src.stem}.times.parquet beside it (a run's output.trace writes it)")
        print(f"wrote {len(files)} ET files {out / args.prefix}.<rank>.et and {out / args.prefix}.json ({how})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stratacl.chakra", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    exp = sub.add_parser("export", help="run directory (output.trace=true) or harness trace (parquet) -> "
                         "per-rank Chakra ET files")
    exp.add_argument("trace", type=Path, help="run directory (each saved trace into <outdir>/<name>/) or trace file")
    exp.add_argument("outdir", type=Path)
    exp.add_argument("--prefix", default="trace", help="file names <prefix>.<rank>.et (default: trace)")
    exp.add_argument("--trace", dest="name", help="export only this saved trace of a run directory")
    exp.add_argument("--library", help="whose simulated times the nodes carry (default: the run's baseline)")
    exp.add_argument("--no-times", action="store_true", help="leave simulated times out")
    imp = sub.add_parser("import", help="per-rank Chakra ET files -> harness trace (parquet)")
    imp.add_argument("source", type=Path, help="directory with one <prefix>.<rank>.et set, or <dir>/<prefix>")
    imp.add_argument("trace", type=Path)
    imp.add_argument("--no-merge", action="store_true", help="keep foreign compute nodes one op per rank")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "export":
            _export_cli(args)
        else:
            trace = import_chakra(args.source, merge=not args.no_merge)
            trace.save(args.trace)
            print(f"wrote {args.trace}: {len(trace.ops)} ops, {len(trace.communicators)} communicators, "
                  f"{trace.world_size} ranks")
    except (HarnessError, ImportError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0

