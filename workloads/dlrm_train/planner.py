"""A memory-balancing sharding planner with TorchRec's sharding types.

- table-wise (TW): a whole table on one die;
- column-wise (CW): a table cut into column shards, each placed like a TW table;
- row-wise (RW): every die holds 1/W of the rows (rows hashed to dies).

`auto` keeps tables table-wise while the largest die stays within `tolerance` of the mean and
turns the largest remaining table row-wise otherwise (RW costs ~W× the pooled traffic of TW, so
it is used only where memory balance needs it). TW/CW shards are placed largest first on the
least-loaded die (LPT).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from stratacl.errors import ConfigError
from workloads.dlrm_train.schema import Sharding

from .tables import Table

BALANCE_TOLERANCE = 0.05  # auto: accept a TW/CW placement within 5 % of perfectly balanced memory


@dataclass(frozen=True)
class Shard:
    """A TW or CW shard: `width` columns of all rows of `table`, on die `owner`."""

    table: int
    owner: int
    rows: int
    width: int
    pooling: int
    row_bytes: int  # bytes of one row of this shard (weights + optimizer state share)

    @property
    def bytes(self) -> float:
        return float(self.rows) * self.row_bytes


@dataclass
class Plan:
    world: int
    shards: list[Shard] = field(default_factory=list)  # TW / CW
    rw_tables: list[Table] = field(default_factory=list)

    def bytes_per_die(self) -> np.ndarray:
        out = np.full(self.world, sum(t.bytes for t in self.rw_tables) / self.world)
        for s in self.shards:
            out[s.owner] += s.bytes
        return out

    def shards_of(self, die: int) -> list[Shard]:
        return [s for s in self.shards if s.owner == die]


def _split(table: Table, parts: int) -> list[tuple[int, int]]:
    """(width, row_bytes) of `parts` column shards; each keeps its own row-wise optimizer state."""
    widths = [table.dim // parts + (1 if i < table.dim % parts else 0) for i in range(parts)]
    return [(w, table.row_bytes(w)) for w in widths if w > 0]


def _lpt(tables: list[Table], world: int, parts: int, base: float) -> list[Shard]:
    items = []
    for t in tables:
        for w, rb in _split(t, parts):
            items.append((t.rows * rb, t, w, rb))
    items.sort(key=lambda x: (-x[0], x[1].index))
    heap = [(base, d) for d in range(world)]
    shards = []
    for _, t, w, rb in items:
        load, d = heapq.heappop(heap)
        shards.append(Shard(t.index, d, t.rows, w, t.pooling, rb))
        heapq.heappush(heap, (load + t.rows * rb, d))
    return shards


def plan(tables: list[Table], world: int, sharding: Sharding | str, column_shards: int,
         capacity_bytes: float) -> Plan:
    """Place tables on `world` dies; fail if a die would hold more than `capacity_bytes`."""
    sharding = Sharding(sharding)
    parts = column_shards if sharding == Sharding.column_wise else 1
    if parts > tables[0].dim:
        raise ConfigError("workload.column_shards", f"{parts} is outside 1..{tables[0].dim}")
    total = sum(t.bytes for t in tables)
    if total > world * capacity_bytes:
        raise ConfigError("workload.total_table_TiB", f"{total / 1e12:.2f} TB of tables (weights + "
                          f"optimizer state) exceed {world} dies × {capacity_bytes / 1e9:.1f} GB",
                          "use fewer/smaller tables, more ranks or more host_dram_GB_per_die")
    if sharding == Sharding.row_wise:
        result = Plan(world, [], list(tables))
    elif sharding == Sharding.table_wise:
        result = Plan(world, _lpt(tables, world, 1, 0.0), [])
    else:
        result = _auto(tables, world, parts, total)
    worst = int(np.argmax(result.bytes_per_die()))
    load = result.bytes_per_die()[worst]
    if load > capacity_bytes:
        big = max((s for s in result.shards if s.owner == worst), key=lambda s: s.bytes, default=None)
        what = f"table {big.table} ({big.bytes / 1e9:.1f} GB)" if big else "its row-wise shards"
        raise ConfigError("workload.sharding", f"'{sharding}' puts {load / 1e9:.1f} GB on die {worst} "
                          f"(largest: {what}) but a die holds at most {capacity_bytes / 1e9:.1f} GB",
                          "use sharding=auto or row_wise, or smaller tables")
    return result


def _auto(tables: list[Table], world: int, parts: int, total: float) -> Plan:
    mean = total / world
    tw = sorted(tables, key=lambda t: (-t.bytes, t.index))
    rw: list[Table] = []
    # tables larger than a die's fair share can never balance table-wise
    while tw and tw[0].bytes / parts > mean:
        rw.append(tw.pop(0))
    while True:
        base = sum(t.bytes for t in rw) / world
        shards = _lpt(tw, world, parts, base)
        p = Plan(world, shards, rw)
        if not tw or p.bytes_per_die().max() <= mean * (1 + BALANCE_TOLERANCE):
            return Plan(world, shards, sorted(rw, key=lambda t: t.index))
        rw.append(tw.pop(0))
