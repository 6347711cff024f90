"""The trace contract (docs/architecture.md): communicators and SPMD ops, the only thing workloads hand over.

One `Op` covers a whole SPMD set of ranks; per-rank values are tuples of length 1 (same on every
rank) or len(ranks). A collective names a communicator *family* (``tp`` = all ``tp[i]``) or one
communicator; its ranks must be exactly covered by the family's groups. Ops on one rank+stream run
in order, collectives on one communicator in issue order (the engine's rule, engine/order.py);
``deps`` adds explicit edges. Traces round-trip through parquet (plain columns, metadata
as JSON — loading never unpickles or executes anything) and validate on load.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stratacl.errors import TraceError
from stratacl.vocab import (
    Collective,
    CopyDirection,
    CoreKind,
    HostPeer,
    KernelClass,
    MoeMode,
    OpKind,
)

if TYPE_CHECKING:
    import pandas as pd

# The plain values of each vocabulary (stratacl.vocab), for checks and messages; the library
# lowering, the config checks and the workloads import them from here.
KINDS = tuple(k.value for k in OpKind)
COLLECTIVES = tuple(c.value for c in Collective)
# every rank sends its own part to every peer
EXCHANGES = tuple(c.value for c in (Collective.alltoall, Collective.alltoallv, Collective.dispatch,
                                    Collective.combine))
CORES = tuple(c.value for c in CoreKind)
MOE_MODES = ("", *(m.value for m in MoeMode))  # "": not a dispatch/combine
# compute kernel classes (Op.kernel); "" = not stated: priced as a generic kernel of its core kind
KERNELS = ("", *(k.value for k in KernelClass))
FORMAT_VERSION = 1
_COMM_NAME = re.compile(r"^([A-Za-z_][\w.]*)\[(\d+)\]$")

Vec = tuple[float, ...]


def family_of(comm_name: str) -> str:
    """`tp[3]` -> `tp`; a name without an index is its own family."""
    m = _COMM_NAME.match(comm_name)
    return m.group(1) if m else comm_name


BEFORE_TRACE = -1  # Trace.buffers: allocated before the trace (weights, KV cache, warm-up)
REGISTERED = -2  # ... and already registered: a JIT registration cache covers its range

MOE_COLLS = (Collective.dispatch.value, Collective.combine.value)


@dataclass(frozen=True, slots=True)
class MoeShape:
    """The MoE layer shape a library needs to lower a trace's dispatch/combine ops, beside each op's
    own `peer_bytes` and `group_tokens`: bytes of one token copy of each (its format: FP8 + scales,
    BF16, ...), routed experts each EP rank hosts (an LL kernel writes each peer's copies into one
    window per expert hit, each its own start-up) and experts per token (DeepEP's layout kernel
    reads the top-k indices). Every trace holding a dispatch/combine op carries one (`Trace.moe`)."""

    dispatch_bytes_per_copy: float
    combine_bytes_per_copy: float
    experts_per_rank: int
    top_k: int

    def bytes_per_copy(self, coll: str) -> float:
        """Bytes of one token copy of a dispatch or a combine."""
        return self.dispatch_bytes_per_copy if coll == Collective.dispatch else self.combine_bytes_per_copy

    def problem(self) -> str:
        """What is wrong with the values ("" when nothing)."""
        for name in ("dispatch_bytes_per_copy", "combine_bytes_per_copy"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                return f"{name} must be a finite number > 0, got {v!r}"
        for name in ("experts_per_rank", "top_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                return f"{name} must be an integer ≥ 1, got {v!r}"
        return ""

    def to_json(self) -> dict[str, float | int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MoeShape:
        """From `to_json`'s dict; a missing or extra key raises KeyError / TypeError."""
        return cls(dispatch_bytes_per_copy=float(d["dispatch_bytes_per_copy"]),
                   combine_bytes_per_copy=float(d["combine_bytes_per_copy"]),
                   experts_per_rank=int(d["experts_per_rank"]), top_k=int(d["top_k"]))


@dataclass(slots=True)
class Op:
    id: int
    kind: str
    ranks: tuple[int, ...]
    name: str = ""
    stream: str = "main"
    deps: tuple[int, ...] = ()
    # compute: per-rank FLOPs and HBM bytes on one kernel kind, or a fixed time. `flops` run on the
    # kind's own unit (cube for cube/mixed, vector for vector); a mixed kernel's vector-unit FLOPs
    # are `vector_flops`. `block_dim`: cores it launches on (AIC for cube, AIV for vector, core
    # groups for mixed, as Ascend C counts blockDim); 0 = all its stream may use.
    flops: Vec = (0.0,)
    hbm_bytes: Vec = (0.0,)
    core: str = "cube"
    fixed_time_s: float = 0.0
    vector_flops: Vec = (0.0,)
    block_dim: int = 0
    dtype: str = ""  # compute: numeric format of a cube op's matmuls ("" = bf16); picks the die's peak
    # compute: what the kernel is (a KernelClass value, "" = not stated) and the matmuls it runs per
    # rank as (m, n, k, count): D[m×n] = A[m×k]·B[k×n], `count` times (groups of a grouped GEMM,
    # batch·heads of attention: (q_len, kv_len, head_dim, b·h) for QKᵀ, (q_len, head_dim, kv_len,
    # b·h) for PV); they set its tile/wave quantisation and re-read traffic (stratacl/machine/kernel_model.py)
    kernel: str = ""
    gemms: tuple[tuple[int, int, int, int], ...] = ()
    # collective: type, communicator family (or one communicator), bytes per rank (nccl-tests)
    coll: str = ""
    comm: str = ""
    nbytes: Vec = (0.0,)  # collective: per rank; p2p: per (src,dst) pair; memcpy: per rank
    peer_bytes: Vec = ()  # alltoallv/dispatch/combine: group-local n×n matrix, row = sender
    buffer: str = ""  # user buffer the op reads/writes (registration, staging)
    moe_mode: str = ""  # dispatch/combine: "ht" | "ll" (MOE_MODES); how the library lowers it
    # dispatch/combine: tokens each member sends to ≥ 1 member of each block of g consecutive
    # members, for every divisor g of the group size n (ascending from 1; n × n/g each, row =
    # sender, dispatch direction), concatenated: the (token, destination node) pairs of any node size
    # (workloads/common/routing.group_tokens; a node-deduplicating library reads its node's block)
    group_tokens: Vec = ()
    # p2p: pairs src[i] -> dst[i]
    src: tuple[int, ...] = ()
    dst: tuple[int, ...] = ()
    # memcpy: "" device-local copy; "host": with the DRAM of the die's own CPU; "pool": with the
    # DRAM pool striped over every CPU of the supernode (HOST_PEERS). direction: "h2d" | "d2h"
    peer: str = ""
    direction: str = "h2d"

    def per_rank(self, values: Vec) -> np.ndarray:
        arr = np.asarray(values, dtype=float)
        return np.full(len(self.ranks), arr[0]) if arr.size == 1 else arr

    def label(self) -> str:
        return f"op {self.id}" + (f" '{self.name}'" if self.name else "") + f" ({self.kind})"


HOST_PEERS = tuple(p.value for p in HostPeer)
DIRECTIONS = tuple(d.value for d in CopyDirection)
_VEC_FIELDS = ("flops", "hbm_bytes", "nbytes", "peer_bytes", "vector_flops", "group_tokens")
# columns added after format 1 was first written, with the value older files mean
_LATE_COLUMNS = {"vector_flops": [0.0], "block_dim": 0, "moe_mode": "", "dtype": "", "kernel": "",
                 "gemms": [], "group_tokens": [], "peer": "", "direction": "h2d"}
_INT_TUPLE_FIELDS = ("ranks", "deps", "src", "dst")


@dataclass
class Trace:
    """Communicators (name -> explicit ranks) and ops (ids 0..n-1 in list order)."""

    world_size: int
    communicators: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)
    # user buffers collectives read/write: name -> ids of the ops whose start (re)allocates it —
    # maps new memory for it, e.g. a dispatch buffer growing with routing; -1 = allocated before
    # the trace starts (weights, KV cache, warm-up allocations)
    buffers: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # per-stream core limits (Ascend stream resource limits): stream -> (AIC, AIV) its kernels may
    # use at most, e.g. a decode micro-batch split of 16 AIC + 32 AIV vs 8 AIC + 16 AIV
    stream_cores: dict[str, tuple[int, int]] = field(default_factory=dict)
    # the MoE layer's shape, for the library lowering its dispatch/combine ops (required with them)
    moe: MoeShape | None = None
    _preds: tuple[int, list[list[int]]] | None = field(default=None, repr=False, compare=False)
    # long vectors (routing tables, n x n peer bytes) shared by every op that carries the same one
    _shared: dict[Vec, Vec] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ building
    def add_communicator(self, name: str, ranks: Iterable[int]) -> str:
        self.communicators[name] = tuple(int(r) for r in ranks)
        return name

    def add_family(self, family: str, groups: Sequence[Sequence[int]]) -> str:
        for i, g in enumerate(groups):
            self.add_communicator(f"{family}[{i}]", g)
        return family

    def add(self, kind: str, ranks: Iterable[int], **payload: object) -> int:
        op_id = len(self.ops)
        # Op fields from whatever the workload passed (scalars, lists, arrays), normalised here and
        # checked by validate()
        values: dict[str, Any] = dict(payload)
        for key in _VEC_FIELDS:
            if key in values:
                values[key] = self.share(_as_vec(values[key]))
        for key in ("deps", "src", "dst"):
            if key in values:
                values[key] = tuple(int(x) for x in values[key])
        if "gemms" in values:
            values["gemms"] = _as_gemms(values["gemms"])
        self.ops.append(Op(id=op_id, kind=kind, ranks=tuple(int(r) for r in ranks), **values))
        return op_id

    def share(self, vec: Vec) -> Vec:
        """A long vector as the one copy this trace keeps of it (SharedVec); short ones as they are."""
        if len(vec) <= _SHARE_LEN:
            return vec
        shared = self._shared.get(vec)
        if shared is None:
            shared = self._shared[vec] = SharedVec(vec)
        return shared

    def add_buffer(self, name: str, alloc_op: int = -1) -> str:
        """Declare that op `alloc_op` (re)allocates user buffer `name` (BEFORE_TRACE = -1: before
        the trace; REGISTERED = -2: before the trace and already registered — a JIT registration
        cache covers it, as the workload's allocator model found).

        Call again for each op that maps new memory for it. Registration-on-allocation starts at
        that op's start. Buffers a collective names without declaring them count as allocated
        before the trace (and not yet registered by a JIT cache).
        """
        self.buffers[name] = (*self.buffers.get(name, ()), int(alloc_op))
        return name

    def limit_stream(self, stream: str, aic: int, aiv: int) -> str:
        """Limit the kernels (compute and communication) of `stream` to `aic` cube and `aiv`
        vector cores per die."""
        self.stream_cores[stream] = (int(aic), int(aiv))
        return stream

    def compute(self, ranks: Iterable[int], flops: object = 0.0, hbm_bytes: object = 0.0,
                core: str = "cube", **kw: object) -> int:
        return self.add("compute", ranks, flops=flops, hbm_bytes=hbm_bytes, core=core, **kw)

    def memcpy(self, ranks: Iterable[int], nbytes: object, peer: str = "", direction: str = "h2d",
               **kw: object) -> int:
        """A copy of `nbytes` per rank: device-local (peer ""), or between the die's HBM and host
        DRAM (peer "host": its own CPU; "pool": the supernode's DRAM pool) in `direction`."""
        return self.add("memcpy", ranks, nbytes=nbytes, peer=peer, direction=direction, **kw)

    def collective(self, coll: str, comm: str, nbytes: object, ranks: Iterable[int] | None = None,
                   **kw: object) -> int:
        if ranks is None:
            ranks = self.family_ranks(comm)
        return self.add("collective", ranks, coll=coll, comm=comm, nbytes=nbytes, **kw)

    # ------------------------------------------------------------------ queries
    def groups_of(self, comm: str) -> list[tuple[int, ...]]:
        """Communicators an op naming `comm` runs on: the one communicator, or the whole family."""
        if comm in self.communicators:
            return [self.communicators[comm]]
        return [r for n, r in self.communicators.items() if family_of(n) == comm]

    def family_ranks(self, comm: str) -> tuple[int, ...]:
        return tuple(sorted(r for g in self.groups_of(comm) for r in g))

    def op_groups(self, op: Op) -> list[tuple[int, ...]]:
        """The communicators of `comm` whose ranks lie inside the op's ranks."""
        rs = set(op.ranks)
        return [g for g in self.groups_of(op.comm) if rs.issuperset(g)]

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise TraceError naming the first bad op; checks acyclicity including stream order."""
        if self.world_size <= 0:
            raise TraceError(f"trace world_size must be positive, got {self.world_size}")
        for name, ranks in self.communicators.items():
            bad = [r for r in ranks if not 0 <= r < self.world_size]
            if not ranks or bad or len(set(ranks)) != len(ranks):
                raise TraceError(f"communicator '{name}' has invalid ranks {list(ranks)[:8]}"
                                 f" (must be distinct, in 0..{self.world_size - 1})")
        families = {family_of(n) for n in self.communicators}
        for stream, lim in self.stream_cores.items():
            if len(lim) != 2 or any(int(c) != c or c < 1 for c in lim):
                raise TraceError(f"stream '{stream}' core limit {lim} must be (AIC, AIV) positive integers")
        for name, allocs in self.buffers.items():
            for alloc in allocs:
                if not REGISTERED <= alloc < len(self.ops):
                    raise TraceError(f"buffer '{name}' is allocated by unknown op {alloc}")
        for idx, op in enumerate(self.ops):
            if op.id != idx:
                raise TraceError(f"op at position {idx} has id {op.id}; ids must be 0..n-1 in order")
            self._validate_op(op, families)
        if self.moe is not None and (msg := self.moe.problem()):
            raise TraceError(f"trace MoeShape: {msg}")
        stream_predecessors(self)  # raises on cycles

    def _validate_op(self, op: Op, families: set[str]) -> None:
        def bad(msg: str) -> TraceError:
            return TraceError(f"{op.label()}: {msg}")

        if op.kind not in KINDS:
            raise bad(f"unknown kind '{op.kind}' (use one of {KINDS})")
        if not op.ranks:
            raise bad("has no ranks")
        if len(set(op.ranks)) != len(op.ranks):
            raise bad("lists a rank twice")
        out = [r for r in op.ranks if not 0 <= r < self.world_size]
        if out:
            raise bad(f"rank {out[0]} outside 0..{self.world_size - 1}")
        for d in op.deps:
            if not 0 <= d < len(self.ops) or d == op.id:
                raise bad(f"depends on unknown op {d}")
        for key in _VEC_FIELDS:
            vals = getattr(op, key)
            if isinstance(vals, SharedVec) and vals.__dict__.get("_checked"):
                continue  # one table many ops carry: checked once
            if not _finite_nonnegative(vals):
                raise bad(f"{key} must be finite and ≥ 0, got {list(vals)[:4]}")
            if isinstance(vals, SharedVec):
                vals.__dict__["_checked"] = True
        for key in ("flops", "hbm_bytes", "vector_flops"):
            if len(getattr(op, key)) not in (1, len(op.ranks)):
                raise bad(f"{key} has {len(getattr(op, key))} values for {len(op.ranks)} ranks")
        if not math.isfinite(op.fixed_time_s) or op.fixed_time_s < 0:
            raise bad(f"fixed_time_s must be ≥ 0, got {op.fixed_time_s}")
        if op.kind == OpKind.compute and op.core not in CORES:
            raise bad(f"core '{op.core}' unknown (use one of {CORES})")
        if any(op.vector_flops) and op.core != CoreKind.mixed:
            raise bad(f"vector_flops are for mixed kernels; a {op.core} kernel puts its FLOPs in flops")
        if op.block_dim < 0:
            raise bad(f"block_dim must be ≥ 0 (0 = all cores), got {op.block_dim}")
        if op.kernel not in KERNELS:
            raise bad(f"kernel '{op.kernel}' unknown (use one of {KERNELS[1:]} or '' for not stated)")
        if (op.kernel or op.gemms) and op.kind != OpKind.compute:
            raise bad("kernel and gemms describe compute kernels only")
        for g in op.gemms:
            if len(g) != 4 or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in g):
                raise bad(f"gemms entry {tuple(g)} must be (m, n, k, count), positive integers")
        if op.kind == OpKind.collective:
            self._validate_collective(op, families, bad)
        if op.moe_mode not in MOE_MODES or (op.moe_mode and op.coll not in MOE_COLLS):
            raise bad(f"moe_mode '{op.moe_mode}' needs coll dispatch/combine and one of {MOE_MODES[1:]}")
        if op.kind == OpKind.p2p:
            if not op.src or len(op.src) != len(op.dst):
                raise bad("p2p needs src and dst of equal, non-zero length")
            if set(op.src) | set(op.dst) != set(op.ranks):
                raise bad("p2p ranks must be exactly the union of src and dst")
            if any(s == d for s, d in zip(op.src, op.dst, strict=True)):
                raise bad("p2p pair sends to itself")
            if len(op.nbytes) not in (1, len(op.src)):
                raise bad(f"nbytes has {len(op.nbytes)} values for {len(op.src)} pairs")
        if op.kind == OpKind.memcpy and len(op.nbytes) not in (1, len(op.ranks)):
            raise bad(f"nbytes has {len(op.nbytes)} values for {len(op.ranks)} ranks")
        if op.peer not in HOST_PEERS or op.direction not in DIRECTIONS or (op.peer and op.kind != OpKind.memcpy):
            raise bad(f"peer '{op.peer}' / direction '{op.direction}': a memcpy's peer is one of "
                      f"{HOST_PEERS}, its direction one of {DIRECTIONS}")

    def _validate_collective(self, op: Op, families: set[str], bad: Callable[[str], TraceError]) -> None:
        if op.coll not in COLLECTIVES:
            raise bad(f"unknown collective '{op.coll}' (use one of {COLLECTIVES})")
        if op.comm not in self.communicators and op.comm not in families:
            raise bad(f"communicator '{op.comm}' is not defined (known families: {sorted(families)})")
        groups = self.op_groups(op)
        covered = sorted(r for g in groups for r in g)
        if covered != sorted(op.ranks):
            raise bad(f"ranks are not exactly covered by groups of '{op.comm}'")
        sizes = {len(g) for g in groups}
        if len(sizes) != 1:
            raise bad(f"groups of '{op.comm}' have different sizes {sorted(sizes)}")
        if len(op.nbytes) not in (1, len(op.ranks)):
            raise bad(f"nbytes has {len(op.nbytes)} values for {len(op.ranks)} ranks")
        n = sizes.pop()
        if op.peer_bytes and len(op.peer_bytes) != n * n:
            raise bad(f"peer_bytes must be a {n}x{n} matrix, got {len(op.peer_bytes)} values")
        if op.group_tokens and len(op.group_tokens) != n * sum(n // g for g in range(1, n + 1) if n % g == 0):
            raise bad(f"group_tokens must hold an n×n/g matrix per divisor g of n={n}, got "
                      f"{len(op.group_tokens)} values")
        if op.coll in MOE_COLLS and self.moe is None:
            raise bad(f"a {op.coll} needs the trace's MoeShape (Trace.moe: bytes per token copy, "
                      "experts per rank, top_k); set it where the trace is built")
        if op.coll == Collective.alltoallv and not op.peer_bytes:
            raise bad("alltoallv needs peer_bytes (group-local n×n matrix)")

    # ------------------------------------------------------------------ parquet I/O
    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        cols = {f.name: [getattr(op, f.name) for op in self.ops] for f in fields(Op)}
        for key in _INT_TUPLE_FIELDS:
            cols[key] = [list(v) for v in cols[key]]
        for key in _VEC_FIELDS:
            cols[key] = [list(v) for v in cols[key]]
        cols["gemms"] = [[list(g) for g in v] for v in cols["gemms"]]
        return pd.DataFrame(cols)

    def save(self, path: str | Path) -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(self.to_frame(), preserve_index=False)
        meta = {
            "stratacl.format_version": str(FORMAT_VERSION),
            "stratacl.world_size": str(self.world_size),
            "stratacl.communicators": json.dumps({k: list(v) for k, v in self.communicators.items()}),
            "stratacl.meta": json.dumps(self.meta, default=str),
            "stratacl.buffers": json.dumps(self.buffers),
            "stratacl.stream_cores": json.dumps({k: list(v) for k, v in self.stream_cores.items()}),
        }
        if self.moe is not None:
            meta["stratacl.moe"] = json.dumps(self.moe.to_json())
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
        path = Path(path)
        pq.write_table(table, path, write_page_checksum=True)  # so a flipped byte is detected on load
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace written by `save`; validate it. Corrupt files raise TraceError."""
        import pyarrow.parquet as pq

        path = Path(path)
        try:
            table = pq.read_table(path, page_checksum_verification=True)
            md = {k.decode(errors="replace"): v.decode(errors="replace")
                  for k, v in (table.schema.metadata or {}).items() if k.startswith(b"stratacl.")}
        except Exception as exc:  # pyarrow raises several types for truncated/corrupt files
            raise TraceError(f"trace file {path} is not a readable parquet trace: {exc}") from None
        if md.get("stratacl.format_version") != str(FORMAT_VERSION):
            raise TraceError(f"trace file {path} lacks stratacl format version {FORMAT_VERSION} "
                             f"metadata (found {md.get('stratacl.format_version')!r})")
        try:
            world = int(md["stratacl.world_size"])
            comms = {k: tuple(int(r) for r in v)
                     for k, v in json.loads(md["stratacl.communicators"]).items()}
            meta = json.loads(md.get("stratacl.meta", "{}"))
            buffers = {str(k): tuple(int(x) for x in v)
                       for k, v in json.loads(md.get("stratacl.buffers", "{}")).items()}
            stream_cores = {str(k): (int(v[0]), int(v[1]))
                            for k, v in json.loads(md.get("stratacl.stream_cores", "{}")).items()}
            moe = moe_shape_from(md.get("stratacl.moe"), meta)
        except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
            raise TraceError(f"trace file {path} has corrupt metadata: {exc}") from None
        trace = cls(world_size=world, communicators=comms, meta=meta, buffers=buffers,
                    stream_cores=stream_cores, moe=moe)
        expected = {f.name for f in fields(Op)}
        text = {f.name for f in fields(Op) if f.type in ("str", str)}
        try:  # a corrupt schema or page can fail anywhere from the column names to the values
            missing = expected - set(table.column_names) - set(_LATE_COLUMNS)
            if missing:
                raise TraceError(f"trace file {path} lacks op columns {sorted(missing)}")
            for row in table.to_pylist():
                for key, default in _LATE_COLUMNS.items():
                    row.setdefault(key, default)
                for key in _INT_TUPLE_FIELDS:
                    row[key] = tuple(int(x) for x in row[key])
                for key in _VEC_FIELDS:
                    row[key] = trace.share(tuple(float(x) for x in row[key]))
                row["gemms"] = _as_gemms(row["gemms"] or ())
                op = Op(**{k: row[k] for k in expected})
                bad = [k for k in text if not isinstance(getattr(op, k), str)]
                if bad or not isinstance(op.id, int) or not isinstance(op.fixed_time_s, float):
                    raise TypeError(f"op {op.id}: wrong column types {bad or ['id/fixed_time_s']}")
                trace.ops.append(op)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # incl. UnicodeDecodeError
            raise TraceError(f"trace file {path} has a malformed op row: {exc}") from None
        trace.validate()
        return trace


def moe_shape_from(saved: str | None, meta: dict[str, Any]) -> MoeShape | None:
    """A saved trace's MoeShape: its own JSON entry, or (files written before it had one) the
    `meta["moe"]` dict of bytes_per_copy {dispatch, combine}, experts_per_rank, top_k, which it
    then takes out of the meta."""
    if saved is not None:
        return MoeShape.from_json(json.loads(saved))
    old = meta.pop("moe", None)
    if old is None:
        return None
    per_copy = old["bytes_per_copy"]
    return MoeShape(float(per_copy["dispatch"]), float(per_copy["combine"]), int(old["experts_per_rank"]),
                    int(old.get("top_k", 0)))


_SHARE_LEN = 64  # vectors longer than this are shared between ops (a dispatch's routing tables)


class SharedVec(tuple[float, ...]):
    """A long op vector many ops carry (an EP-64 dispatch's routing tables hold 8,128 numbers, the
    same for every micro-batch of a layer): stored once per trace, and hashing once, since the
    library's per-op lowering cache keys on it."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = tuple.__hash__(self)
        return h


def _finite_nonnegative(vals: Vec) -> bool:
    if len(vals) > _SHARE_LEN:  # a routing table or peer matrix: vectorised
        a = np.asarray(vals, dtype=float)
        return bool(np.isfinite(a).all() and (a >= 0).all())
    if len(vals) == 1:  # most ops' values: one per rank, broadcast
        return 0.0 <= vals[0] < math.inf  # False for NaN, ±inf and negatives
    return all(0.0 <= v < math.inf for v in vals)


def _as_vec(value: object) -> Vec:
    if isinstance(value, int | float | np.integer | np.floating):
        return (float(value),)
    return tuple(np.asarray(value, dtype=float).ravel().tolist())  # tolist: Python floats, in C


def _as_gemms(value: Iterable[Iterable[float]]) -> tuple[tuple[float, ...], ...]:
    """(m, n, k, count) tuples as ints; a non-integral or wrongly sized entry is kept as it is so
    validation names the op."""
    out: list[tuple[float, ...]] = []
    for entry in value:
        g = tuple(entry)
        try:
            out.append(tuple(int(x) for x in g) if all(float(x).is_integer() for x in g) else g)
        except (TypeError, ValueError, OverflowError):
            out.append(g)
    return tuple(out)


def stream_predecessors(trace: Trace) -> list[list[int]]:
    """All predecessors of each op (explicit deps + previous op on each rank's stream).

    Raises TraceError on a cycle, naming an op on it. Cost: O(total rank memberships), once per
    trace (cached while no op is added).
    """
    if trace._preds is not None and trace._preds[0] == len(trace.ops):
        return trace._preds[1]
    last: dict[str, np.ndarray] = {}
    arrays: dict[tuple[int, ...], np.ndarray] = {}
    preds: list[list[int]] = []
    for op in trace.ops:
        arr = arrays.get(op.ranks)
        if arr is None:
            arr = arrays[op.ranks] = np.fromiter(op.ranks, dtype=np.int64, count=len(op.ranks))
        lst = last.get(op.stream)
        if lst is None:
            lst = last[op.stream] = np.full(trace.world_size, -1, dtype=np.int64)
        prev = lst[arr]
        p = set(op.deps)
        first = prev[0]
        if first >= 0 and (prev == first).all():
            p.add(int(first))
        else:
            p.update(int(x) for x in np.unique(prev) if x >= 0)
        lst[arr] = op.id
        preds.append(sorted(p))
    _check_acyclic(trace, preds)
    trace._preds = (len(trace.ops), preds)
    return preds


def _check_acyclic(trace: Trace, preds: list[list[int]]) -> None:
    n = len(preds)
    indeg = [len(p) for p in preds]
    succ: list[list[int]] = [[] for _ in range(n)]
    for i, p in enumerate(preds):
        for j in p:
            succ[j].append(i)
    stack = [i for i in range(n) if indeg[i] == 0]
    seen = 0
    while stack:
        i = stack.pop()
        seen += 1
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    if seen != n:
        stuck = next(i for i in range(n) if indeg[i] > 0)
        raise TraceError(f"{trace.ops[stuck].label()} is on a dependency cycle "
                         "(explicit deps plus per-rank stream order)")
