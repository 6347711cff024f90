"""The decode-layer check row: CloudMatrix-Infer's decode layer per stream against the harness's.

CloudMatrix-Infer (2506.12708 §4.2.3, Fig. 14b) runs decode as two micro-batches interleaved on two
streams per die: stream 0 (16 AIC + 32 AIV: MLAProlog, FusedAttention, O_PROJ) and stream 1 (8 AIC
+ 16 AIV: Gate, Dispatch, MLP, Combine), each ≈ 600 µs per micro-batch per layer at 4K context,
96 sequences per NPU, MTP, EP320. That is a CHECK: no parameter is set from it.

The harness side is the `+experiment=cloudmatrix_infer` decode step (the baseline library,
cann_ep): its decode trace replayed, each stream's time per micro-batch per MoE layer = the summed
device time of that stream's ops of the layer (op end − start, so waiting on a dependency does not
count), averaged over the MoE layers and both micro-batches. The harness prices MLAProlog and
O_PROJ as one projection kernel (`L<i>.attn`, its norms in `.attn.vec`), the gate as the router GEMM
(`L<i>.gate`) and the top-k / token-permute pass (`.gate.route`) before the dispatch, and a shared
expert every die runs for its own tokens as `L<i>.shared` (none in EP320: its 32 replicas run it as
routed rows, inside the MLP of the dies that hold them); the per-op rows name what each holds.
"""

from __future__ import annotations

import re
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from stratacl.trace import Trace

PUBLISHED_US = 600.0
# hbm_saturation_cores values the range table shows: core groups a kernel needs to draw the die's
# whole HBM rate (an ASSUMPTION knob of the 910C kernel model, 12 of 24 by default; no public figure)
SAT_RANGE = (4, 8, 12, 16, 24)
SOURCE = "CloudMatrix-Infer, 2506.12708 §4.2.3 Fig. 14b (4K, 96 per NPU, MTP, EP320)"
GROUP = "910c decode layer per stream"
EXPERIMENT = ("+experiment=cloudmatrix_infer", "library=[cann_ep]", "baseline=cann_ep")
COMMAND = ("python -m stratacl.validate (or --decode-layer RUN_DIR: a saved python -m stratacl.run "
           "+experiment=cloudmatrix_infer output.trace=true)")
ATTN, MOE = "attn_path", "moe_path"  # the pipeline's streams in the trace (workloads' llm_infer)
# (stream in the trace, the paper's stream, the paper's op, the harness op kinds it holds)
OPS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (ATTN, "stream 0", "MLAProlog + O_PROJ", ("attn", "attn.vec")),
    (ATTN, "stream 0", "FusedAttention", ("attn_core",)),
    (MOE, "stream 1", "Gate (+ local shared expert)", ("gate", "gate.route", "shared")),
    (MOE, "stream 1", "Dispatch", ("dispatch",)),
    (MOE, "stream 1", "MLP (routed expert)", ("moe",)),
    (MOE, "stream 1", "Combine", ("combine",)),
)
_NAME = re.compile(r"^L(?P<layer>\d+)\.(?P<kind>[a-z_]+)\.mb(?P<mb>\d+)(?:\.(?P<part>[a-z_]+))?$")


@dataclass(frozen=True)
class OpTime:
    stream: str  # the paper's stream
    op: str  # the paper's op
    harness_us: float  # per micro-batch per MoE layer


@dataclass(frozen=True)
class StreamRow:
    """One check row of the report (the `Measured` protocol of stratacl.validate.kernels)."""

    id: str
    measured: float
    harness: float
    group: str = GROUP
    role: str = "check"
    unit: str = "us"

    @property
    def error(self) -> float:
        return self.harness / self.measured - 1.0


def breakdown(trace: Trace, start: np.ndarray, end: np.ndarray) -> list[OpTime]:
    """Each paper op's harness time per micro-batch per MoE layer (a layer with a dispatch)."""
    per: dict[tuple[int, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for op in trace.ops:
        m = _NAME.match(op.name)
        if m is None:
            continue
        kind = m["kind"] + (f".{m['part']}" if m["part"] else "")
        per[(int(m["layer"]), int(m["mb"]))][f"{op.stream}:{kind}"] += float(end[op.id] - start[op.id])
    moe = [v for v in per.values() if f"{MOE}:dispatch" in v]
    if not moe:
        raise ValueError("the decode trace runs no MoE layer on CloudMatrix-Infer's two streams "
                         f"({ATTN}, {MOE}): save a run with two-batch overlap "
                         "and the cloudmatrix_tbo stream layout")
    return [OpTime(paper_stream, op, 1e6 * statistics.fmean(sum(v.get(f"{stream}:{k}", 0.0) for k in kinds)
                                                           for v in moe))
            for stream, paper_stream, op, kinds in OPS]


def stream_rows(ops: Sequence[OpTime]) -> list[StreamRow]:
    """Per stream: the sum of its ops against the published ≈ 600 µs."""
    streams = dict.fromkeys(o.stream for o in ops)
    return [StreamRow(f"decode layer {s}", PUBLISHED_US, sum(o.harness_us for o in ops if o.stream == s))
            for s in streams]


def saved_decode(run_dir: Path) -> tuple[Trace, np.ndarray, np.ndarray]:
    """The decode trace a run saved (output.trace=true) and its baseline's replay times."""
    from stratacl.run_traces import replay_times, saved_traces

    for path in saved_traces(run_dir):
        trace = Trace.load(path)
        if trace.meta.get("phase") == "decode":
            times = replay_times(path)
            if times is None:
                raise ValueError(f"{path}: no replay times saved beside it")
            return trace, times.start, times.end
    raise ValueError(f"{run_dir}: the run saved no decode trace")


def simulated_decode() -> tuple[Trace, np.ndarray, np.ndarray]:
    """The `+experiment=cloudmatrix_infer` decode step of cann_ep, run in process."""
    from stratacl.comm.library import LibraryModel
    from stratacl.machine.fabric import Fabric
    from stratacl.run_traces import TraceRecorder
    from stratacl.validate.operators import compose
    from stratacl.workload_api import RunContext
    from stratacl.workload_registry import spec

    cfg = compose(EXPERIMENT)
    fab = Fabric(cfg.fabric)
    libs = {name: LibraryModel(name, cfg.library[name], fab) for name in cfg.library}
    with tempfile.TemporaryDirectory() as tmp:
        rec = TraceRecorder(Path(tmp))
        ctx = RunContext(cfg=cfg, fabric=fab, libraries=libs, baseline=cfg.baseline, seed=cfg.seed, recorder=rec)
        spec(cfg.workload.name).run()(ctx)
        rec.close()
        return saved_decode(Path(tmp))


def skew_note(trace: Trace) -> str:
    """How far the busiest die's routed-expert work is above the mean in the replayed step: the
    MLP and Combine rows are the busiest die's (an SPMD op ends with its last rank), so they follow
    the router's load law (workload.expert_load: a measured figure) through the expert placement."""
    ratios = [float(np.max(op.flops) / np.mean(op.flops)) for op in trace.ops
              if (m := _NAME.match(op.name)) and m["kind"] == "moe" and not m["part"] and np.mean(op.flops) > 0]
    if not ratios:
        return ""
    return (f"routed-expert FLOPs on the busiest die: {statistics.fmean(ratios):.2f}x the mean die's (mean over "
            "MoE layers and micro-batches); MLP and Combine are the busiest die's, so they follow the router "
            "law (workload.expert_load, from UltraEP's measured imbalance) left after the expert placement")


def hbm_range(trace: Trace, start: np.ndarray, end: np.ndarray,
              sats: Sequence[int] = SAT_RANGE) -> list[tuple[int, list[OpTime]]]:
    """The breakdown with every compute op priced alone on its stream's cores (no contention) at
    each `hbm_saturation_cores` value: how much HBM bandwidth a kernel on a third (MoE path) or
    two thirds (attention path) of the die can still draw decides its memory-bound ops.
    Dispatch and combine keep their replayed times."""
    from stratacl.machine.compute import NO_LIMIT, core_fraction
    from stratacl.machine.fabric import Fabric
    from stratacl.machine.kernel_model import KernelModel
    from stratacl.validate.operators import compose
    from stratacl.vocab import OpKind

    fab = Fabric(compose(EXPERIMENT).fabric)
    out = []
    for sat in sats:
        km = KernelModel(replace(fab.cfg.die.kernel, hbm_saturation_cores=sat), fab.cube_cores,
                         fab.vector_cores, fab.hbm_Bps)
        took = end - start
        for op in trace.ops:
            if op.kind == OpKind.compute and _NAME.match(op.name):
                frac = core_fraction(op, fab, trace.stream_cores.get(op.stream, NO_LIMIT))
                kt = km.price(op, frac, fab.cube_peak(op.dtype), fab.vector_flops, fab.cube_format(op.dtype))
                took[op.id] = max(op.fixed_time_s, kt.alone_s) + kt.launch_s
        out.append((sat, breakdown(trace, np.zeros_like(took), took)))
    return out


def range_report(rows: Sequence[tuple[int, Sequence[OpTime]]]) -> list[str]:
    if not rows:
        return []
    ops = [o.op.split(" (")[0] for o in rows[0][1]]
    lines = ["HBM a limited stream can draw (fabric.die.kernel.hbm_saturation_cores: ASSUMPTION knob, "
             "range shown; each compute op alone on its stream's cores, dispatch/combine as replayed), µs:",
             f"{'sat':>4s} " + " ".join(f"{o:>18s}" for o in ops) + f" {'stream 0':>9s} {'stream 1':>9s}"]
    for sat, times in rows:
        per = {o.stream: 0.0 for o in times}
        for o in times:
            per[o.stream] += o.harness_us
        lines.append(f"{sat:4d} " + " ".join(f"{o.harness_us:18.1f}" for o in times)
                     + f" {per.get('stream 0', 0.0):9.1f} {per.get('stream 1', 0.0):9.1f}")
    return lines


def report(ops: Sequence[OpTime], sat_range: Sequence[tuple[int, Sequence[OpTime]]] = ()) -> str:
    from stratacl.validate.kernels import summary

    rows = stream_rows(ops)
    lines = [f"decode layer per stream ({SOURCE}; check rows, never a calibration)", f"  {COMMAND}",
             f"{'stream':9s} {'op':26s} {'harness µs':>10s}"]
    lines += [f"{o.stream:9s} {o.op:26s} {o.harness_us:10.1f}" for o in ops]
    lines += [f"{r.id:36s} {'check':9s} public {r.measured:6.0f} µs  harness {r.harness:6.0f} µs  {r.error:+7.1%}"
              for r in rows]
    lines += [f"{g:40s} {role:9s} {n:4d} {med:11.1%} {worst:10.1%}"
              for g, role, n, med, worst in summary([(r, r.harness, r.error) for r in rows])]
    return "\n".join(lines + range_report(sat_range))
