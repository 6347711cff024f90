"""One DLRM die's tensors, run through the library's device allocator.

TorchRec-style, per die: the replicated dense parameters, their gradients and optimizer states
(one tensor per parameter) exist from the start; every iteration allocates, in order, the input
all-to-all's send and receive buffers (lengths, then indices), the pooled embeddings this die sends
and the ones it receives, the row-wise tables' reduce-scatter / all-gather buffers, the dense
part's activations, then in backward the pooled-embedding gradients going back (the transpose of
the forward exchange), and frees them. Their sizes follow each iteration's sampled lookups, so the
iterations differ, and with expandable segments off the allocator caches segments of stale sizes.
Its reserved peak (tensors plus fragmentation) is what the die holds besides the embedding cache:
the cache gets what is left, so a library that fragments more serves from a smaller cache.
"""

from __future__ import annotations

from workloads.dlrm_train.schema import DlrmTrainConfig

from .model import DenseCosts
from .traffic import IterationTraffic


def die_ops(cfg: DlrmTrainConfig, dense: DenseCosts, traffic: list[IterationTraffic], die: int) -> list[tuple]:
    """("alloc", name, bytes) / ("free", name) for die `die` over the run's iterations."""
    ops: list[tuple] = []
    params = [*dense.params_bottom, *dense.params_top]
    per_param = cfg.param_dtype_bytes
    for i, n in enumerate(params):
        ops.append(("alloc", f"param{i}", n * per_param))
        ops.append(("alloc", f"grad{i}", n * per_param))
        for s in range(cfg.dense_optimizer_states):
            ops.append(("alloc", f"state{i}.{s}", n * per_param))
    w = len(traffic[0].lengths) if traffic else 1
    for tf in traffic:
        fwd = []

        def a(name: str, nbytes: float, keep: list = fwd) -> None:
            ops.append(("alloc", name, nbytes))
            keep.append(name)

        for tag, m in (("lengths", tf.lengths), ("indices", tf.indices), ("pooled", tf.pooled)):
            a(f"{tag}.send", float(m[die].sum()))
            a(f"{tag}.recv", float(m[:, die].sum()))
        a("rw.send", tf.rw_bytes)
        a("rw.recv", tf.rw_bytes / w)
        a("activations", dense.activation_bytes)
        for name in ("lengths.send", "lengths.recv"):  # consumed by the lookup
            ops.append(("free", name))
            fwd.remove(name)
        a("pooled_grad.send", float(tf.pooled[:, die].sum()))  # backward: the transpose
        a("pooled_grad.recv", float(tf.pooled[die].sum()))
        for name in reversed(fwd):
            ops.append(("free", name))
    return ops
