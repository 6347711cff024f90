"""Per-die HBM budget: what is left for embeddings after the runtime, the communication library
and what the device allocator reserves for the dense model and the iterations' buffers (their
tensors plus its fragmentation, allocation.py); tables that do not fit get a cache, as large as
what is left — a library that holds or fragments more gets a smaller one."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stratacl.errors import ConfigError
from workloads.dlrm_train.schema import DlrmTrainConfig

from .model import DenseCosts


@dataclass(frozen=True)
class DieBudget:
    """Where one die's HBM goes (bytes; per-die arrays over the dies), and the embedding cache it leaves."""

    hbm_bytes: float
    reserve_bytes: float  # runtime / framework reserve (knob)
    dense_bytes: float  # replicated dense params + grads + optimizer states
    work_bytes: np.ndarray  # per die: activations + send/recv buffers of one iteration
    library_bytes: float  # held by the communication library
    table_bytes: np.ndarray  # per die: this die's shards (weights + optimizer state)
    cache_bytes: np.ndarray  # per die: HBM holding table rows (= table_bytes when all fit)
    reserved_bytes: np.ndarray  # per die: the allocator's reserved peak for dense state + buffers
    fragmentation_bytes: np.ndarray  # per die: its reserved peak - allocated peak

    @property
    def budget_bytes(self) -> np.ndarray:
        return self.hbm_bytes - self.reserve_bytes - self.reserved_bytes - self.library_bytes

    @property
    def resident(self) -> np.ndarray:
        return self.cache_bytes >= self.table_bytes


def dense_state_bytes(cfg: DlrmTrainConfig, dense: DenseCosts) -> float:
    params = sum(dense.params_bottom) + sum(dense.params_top)
    return params * cfg.param_dtype_bytes * (2 + cfg.dense_optimizer_states)


def die_budget(cfg: DlrmTrainConfig, hbm_bytes: float, dense: DenseCosts, work_bytes: np.ndarray,
               table_bytes: np.ndarray, library_bytes: float, library: str, reserved_bytes: np.ndarray,
               fragmentation_bytes: np.ndarray) -> DieBudget:
    reserve = cfg.runtime_reserve_GB * 1e9
    mem = DieBudget(hbm_bytes, reserve, dense_state_bytes(cfg, dense), work_bytes, library_bytes,
                    table_bytes, np.zeros_like(table_bytes), reserved_bytes, fragmentation_bytes)
    budget = mem.budget_bytes
    if budget.min() <= 0:
        raise ConfigError("workload.runtime_reserve_GB", f"no HBM left for embeddings with library "
                          f"'{library}' (it holds {library_bytes / 1e9:.2f} GB per die; budget "
                          f"{budget.min() / 1e9:.2f} GB)", "lower the reserve, the batch or library memory")
    cap = cfg.cache_GB_per_die * 1e9 if cfg.cache_GB_per_die > 0 else np.inf
    cache = np.minimum(np.minimum(budget, cap), table_bytes)
    return DieBudget(hbm_bytes, reserve, mem.dense_bytes, work_bytes, library_bytes, table_bytes, cache,
                     reserved_bytes, fragmentation_bytes)
