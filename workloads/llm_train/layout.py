"""The device mesh: which dies form the fsdp, tp, ep and efsdp communicators.

rank = s·(fsdp·tp) + f·tp + t (TP innermost, so a TP group sits on neighbouring dies of one node;
pipeline stage s outermost, so a stage is a contiguous block of the fabric's placement — whole
nodes when a stage spans at least one — and its p2p neighbours are the same positions of the next
block). Every family below is formed inside each stage (indices are stage-local, shown for s = 0).
- ``tp[f]``    = {f·tp + t : t}                 tensor parallel (attention heads, MLP columns)
- ``fsdp[t]``  = {f·tp + t : f}                 non-expert parameters sharded over 128 dies
- ``ep[g]``    = ranks g·ep … g·ep + ep − 1     TorchTitan with expert-TP = 1: EP borrows
                 ep/tp FSDP ranks × the whole TP group (tokens are sequence-sharded over TP)
- ``efsdp[j]`` = {g·ep + j : g}                 expert weights sharded over the dies holding
                 the same experts: dies / ep = fsdp / (ep / tp) ranks
- ``fsdp_rs`` / ``efsdp_rs``: the same groups again as their own communicators, only with
  `separate_reduce_scatter` (FSDP2's opt-in `set_separate_reduce_scatter_group`); by default the
  gradient reduce-scatters share the all-gathers' process group, i.e. one communicator
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stratacl.errors import ConfigError
from stratacl.trace import Trace

if TYPE_CHECKING:
    from .blocks import Unit


@dataclass(frozen=True)
class Layout:
    dies: int
    fsdp: int
    tp: int
    ep: int
    separate_reduce_scatter: bool = False  # reduce-scatters on their own process groups (FSDP2 opt-in)
    pp: int = 1  # pipeline stages (pipeline ranks); each holds dies / pp dies

    @property
    def stage_dies(self) -> int:
        return self.dies // self.pp

    @property
    def efsdp(self) -> int:
        return self.stage_dies // self.ep

    def shard_params(self, unit: Unit) -> int:
        """Parameters of `unit` one die holds: its dense part over fsdp, its experts over efsdp."""
        return -(-unit.params // self.fsdp) + -(-unit.expert_params // self.efsdp)

    def stage_ranks(self, rank: int) -> tuple[int, ...]:
        """The dies of pipeline rank `rank` (a contiguous block)."""
        n = self.stage_dies
        return tuple(range(rank * n, (rank + 1) * n))

    def check(self, n_experts: int) -> None:
        if self.fsdp * self.tp * self.pp != self.dies:
            raise ConfigError("workload.fsdp", f"pp {self.pp} × fsdp {self.fsdp} × tp {self.tp} = "
                              f"{self.pp * self.fsdp * self.tp} ≠ dies {self.dies}",
                              "choose fsdp = dies / (tp · pp)")
        if n_experts == 0 and self.ep != 1:
            raise ConfigError("workload.ep", f"ep={self.ep} but the model has no routed experts",
                              "use workload.ep=1 for a dense model")
        if self.ep > 1:
            if self.ep % self.tp or self.stage_dies % self.ep:
                raise ConfigError("workload.ep", f"ep={self.ep} must be a multiple of tp={self.tp} "
                                  f"and divide a stage's {self.stage_dies} dies (EP spans whole TP groups)",
                                  f"e.g. ep={self.tp * max(1, self.fsdp // 2)}")
            if n_experts % self.ep:
                raise ConfigError("workload.ep", f"ep={self.ep} does not divide the model's "
                                  f"{n_experts} routed experts", "use a divisor of the expert count")

    def groups(self) -> dict[str, list[list[int]]]:
        """Families with more than one rank per group (size-1 groups need no communication)."""
        tp, ep, world = self.tp, self.ep, self.stage_dies
        fam = {
            "tp": [[f * tp + t for t in range(tp)] for f in range(self.fsdp)],
            "fsdp": [[f * tp + t for f in range(self.fsdp)] for t in range(tp)],
            "ep": [list(range(g * ep, (g + 1) * ep)) for g in range(world // ep)],
            "efsdp": [[g * ep + j for g in range(world // ep)] for j in range(ep)],
        }
        fam = {k: v for k, v in fam.items() if len(v[0]) > 1}
        if self.pp > 1:  # the same groups inside every stage
            fam = {k: [[world * s + r for r in g] for s in range(self.pp) for g in v] for k, v in fam.items()}
        if self.separate_reduce_scatter:
            fam.update({f"{k}_rs": fam[k] for k in ("fsdp", "efsdp") if k in fam})
        return fam

    def reduce_scatter_family(self, fam: str) -> str:
        """The communicator family a gradient reduce-scatter of `fam` (fsdp / efsdp) runs on."""
        return f"{fam}_rs" if self.separate_reduce_scatter else fam

    def add_to(self, trace: Trace) -> list[str]:
        fams = self.groups()
        for name, groups in fams.items():
            trace.add_family(name, groups)
        return list(fams)

    def communicators_per_rank(self) -> int:
        return len(self.groups())
