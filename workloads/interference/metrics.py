"""What the interference workload's metrics mean for a verdict."""

from __future__ import annotations

from stratacl.directions import COPY, MetricInfo, metric

METRICS: dict[str, MetricInfo] = {
    "compute_alone_s": metric(None, "s", "compute alone"),
    "comm_alone_s": metric("lower", "s", "communication alone"),
    "back_to_back_s": metric("lower", "s", "compute then comm"),
    "overlapped_s": metric("lower", "s", "overlapped step"),
    "compute_overlapped_s": metric("lower", "s", "compute under overlap"),
    "overlap_s": metric(None, "s", "overlap window"),
    "compute_slowdown": metric("lower", "fraction", "compute slowdown"),
    "concurrent_compute_slowdown": metric("lower", "fraction", "concurrent compute slowdown"),
    # its parts: a replay without the loaded-memory-latency stall gives the sharing part, the rest is the stall
    "concurrent_slowdown_sharing": metric("lower", "fraction", "… of it from HBM bandwidth / core sharing"),
    "concurrent_slowdown_hbm_stall": metric("lower", "fraction", "… of it from the HBM latency stall"),
    "step_vs_back_to_back": metric("lower", "ratio", "step / back-to-back"),
    "comm_vector_core_s": metric("lower", "core·s", "vector cores held by comm"),
    "comm_hbm_GB_per_die": metric("lower", "GB", "comm HBM traffic/die", mechanism=COPY),
    "fwd_compute_slowdown": metric("lower", "fraction", "forward compute slowdown"),
    "bwd_compute_slowdown": metric("lower", "fraction", "backward compute slowdown"),
}

HEADLINES = ("overlapped_s",)
# how much the compute itself slowed under the overlap: shown beside the headline, never judged
CONTEXT = ("concurrent_compute_slowdown", "concurrent_slowdown_hbm_stall", "concurrent_slowdown_sharing",
           "compute_slowdown", "fwd_compute_slowdown", "bwd_compute_slowdown")
