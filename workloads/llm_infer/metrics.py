"""What llm_infer's metrics mean for a verdict (stratacl/directions.py: the conventions)."""

from __future__ import annotations

from stratacl.directions import EXPOSED, MEMORY, MetricInfo, metric

METRICS: dict[str, MetricInfo] = {
    "throughput_tok_per_s": metric("higher", "tok/s", "output throughput", pinned=True),
    "total_throughput_tok_per_s": metric("higher", "tok/s", "total throughput", pinned=True),
    "requests_per_s": metric("higher", "req/s", "completed requests", pinned=True),
    "saturation_throughput_tok_per_s": metric("higher", "tok/s", "saturation throughput (closed loop)"),
    "saturation_requests_per_s": metric("higher", "req/s", "saturation request rate (closed loop)"),
    "saturation_population": metric("higher", "requests", "closed-loop population (KV-bound)", mechanism=MEMORY),
    "saturation_mean_decode_batch_per_die": metric(None, "seq", "decode batch/die at saturation"),
    "saturation_kv_utilisation": metric(None, "fraction", "KV use at saturation"),
    "saturation_prefill_die_busy_fraction": metric(None, "fraction", "prefill die busy at saturation"),
    "slo_capacity_req_per_s": metric("higher", "req/s", "SLO capacity"),
    "slo_capacity_capped": metric(None, "flag", "SLO search capped"),
    "mean_decode_batch_per_die": metric(None, "seq", "decode batch/die"),
    "max_decode_batch_per_die": metric(None, "seq", "max decode batch/die"),
    "kv_utilisation_mean": metric(None, "fraction", "KV cache use"),
    "decode_step_s_mean": metric("lower", "s", "decode step"),
    "decode_exposed_comm_share": metric("lower", "fraction", "exposed comm share of a decode step", mechanism=EXPOSED),
    # utilisation and load (workload.py summarise, deployment.py load_metrics): context, not judged
    "prefill_die_busy_fraction": metric(None, "fraction", "prefill die busy (its own tokens)"),
    "decode_die_busy_fraction": metric(None, "fraction", "decode die stepping (time, not load)"),
    "decode_batch_fraction": metric(None, "fraction", "decode batch / TPOT-feasible batch"),
    "load_fraction": metric(None, "fraction", "served rate / layout's analytic capacity"),
    "offered_load_fraction": metric(None, "fraction", "offered rate / layout's analytic capacity"),
    "overloaded": metric(None, "flag", "overloaded (regime note)"),
    # the router skew (workload.skew / zipf_s) the expert placement leaves: the busiest die's expected
    # expert rows over the mean; context (the same for every library)
    "decode_expert_imbalance": metric(None, "×", "busiest die's expert rows / mean (decode placement)"),
    "offered_req_per_s": metric(None, "req/s", "offered rate (arrivals in the window)"),
    "served_fraction": metric(None, "fraction", "share of the arrival rate served (backlog floor)"),
    "prefill_served_fraction": metric(None, "fraction", "share of the prompt-token arrival rate prefilled"),
    "decode_served_fraction": metric(None, "fraction", "share of decode arrivals admitted"),
    "backlog_growth_req_per_s": metric(None, "req/s", "backlog growth (arrival rate not served)"),
    "prefill_load_fraction": metric(None, "fraction", "served rate / prefill capacity"),
    "decode_load_fraction": metric(None, "fraction", "served rate / decode capacity"),
    "prefill_capacity_req_per_s": metric("higher", "req/s", "prefill capacity (analytic)"),
    "decode_capacity_req_per_s": metric("higher", "req/s",
                                        "decode capacity: the best rate within the TPOT SLO and batch limits (analytic)"),
    "decode_capacity_batch_per_die": metric(None, "seq", "decode batch/die at which the decode capacity is reached"),
    "decode_slo_batch_per_die": metric("higher", "seq", "TPOT-feasible decode batch/die"),
    # llm_infer, deployment search (mode=search): DistServe goodput at each library's best layout
    "goodput_req_per_s": metric("higher", "req/s", "goodput at the best layout"),
    "goodput_per_die": metric("higher", "req/s/die", "goodput/die at the best layout"),
    "goodput_capped": metric(None, "flag", "goodput capped (top served rate met the SLO)"),
    "analytic_capacity_req_per_s": metric("higher", "req/s", "best analytic capacity"),
    "best_layout_analytic_req_per_s": metric(None, "req/s", "analytic capacity of the goodput-best layout"),
    "goodput_over_analytic": metric(None, "ratio", "served goodput / analytic capacity"),
    "fixed_layout_goodput_req_per_s": metric("higher", "req/s", "goodput at the configured layout"),
    "fixed_layout_goodput_per_die": metric("higher", "req/s/die", "goodput/die at the configured layout"),
    "fixed_layout_analytic_req_per_s": metric("higher", "req/s", "configured layout's analytic capacity"),
    "fixed_layout_capped": metric(None, "flag", "configured layout's goodput capped"),
    "slo_ttft_s": metric(None, "s", "TTFT SLO"),
    "slo_tpot_s": metric(None, "s", "TPOT SLO"),
    "candidates": metric(None, "layouts", "candidate layouts priced"),
    "iteration_traces_simulated": metric(None, "traces", "iteration traces simulated"),
    "weights_GiB_per_die": metric(None, "GiB", "weights/die"),
    "activations_GiB_per_die": metric(None, "GiB", "activations/die"),
    "comm_buffers_GiB_per_die": metric("lower", "GiB", "comm buffers/die"),
    "pool_GiB_per_die": metric("lower", "GiB", "registered pool/die"),
    "library_GiB_per_die": metric("lower", "GiB", "library memory/die", mechanism=MEMORY),
    "kv_cache_GiB_per_die": metric("higher", "GiB", "KV cache/die", mechanism=MEMORY),
    "reserved_GiB_per_die": metric(None, "GiB", "allocator reserved/die"),
    "fragmentation_GiB_per_die": metric("lower", "GiB", "fragmentation/die", mechanism=MEMORY),
    "startup_fragmentation_GiB_per_die": metric("lower", "GiB", "start-up fragmentation/die"),
    "expandable_segments": metric(None, "flag", "expandable segments on"),
    "remap_fraction": metric("lower", "fraction", "decode iterations remapping"),
    "prefill_remap_fraction": metric("lower", "fraction", "prefill iterations remapping"),
    "jit_hit_rate": metric("higher", "fraction", "JIT registration hit rate"),
    "prefill_jit_hit_rate": metric("higher", "fraction", "prefill JIT hit rate"),
    "register_ms_per_decode_iter": metric("lower", "ms", "registration per decode iteration"),
    "register_ms_per_prefill_iter": metric("lower", "ms", "registration per prefill iteration"),
    # llm_infer, fixed mode
    "decode_tok_per_s_per_npu": metric("higher", "tok/s", "decode throughput/NPU"),
    "decode_tpot_s": metric("lower", "s", "decode TPOT"),
    "decode_step_s": metric("lower", "s", "decode step"),
    "decode_exposed_comm_s": metric("lower", "s", "exposed comm per decode step", mechanism=EXPOSED, per="decode_step_s"),
    "prefill_tok_per_s_per_npu": metric("higher", "tok/s", "prefill throughput/NPU"),
    "prefill_iter_s": metric("lower", "s", "prefill iteration"),
    "prefill_exposed_comm_s": metric("lower", "s", "exposed comm per prefill iteration", mechanism=EXPOSED,
                                 per="prefill_iter_s"),
    "decode_weights_GB_per_die": metric(None, "GB", "decode weights/die"),
    "decode_kv_GB_per_die": metric("higher", "GB", "decode KV cache/die", mechanism=MEMORY),
    "prefill_weights_GB_per_die": metric(None, "GB", "prefill weights/die"),
}

# A deployment search (mode=search) leads with goodput per die at each library's best layout; a
# fixed request rate with tail latency and closed-loop saturation, not the output throughput (the
# offered load pins it).
HEADLINES = ("goodput_per_die", "fixed_layout_goodput_per_die", "tpot_p99_s", "e2e_p99_s",
             "saturation_throughput_tok_per_s", "slo_capacity_req_per_s",
             "ttft_p99_s", "decode_tok_per_s_per_npu", "decode_tpot_s", "prefill_tok_per_s_per_npu")

CAVEATS = {"overloaded": "overloaded (regime note): the queue grows, so latency P99s grow with "
                         "the run's length, not only with the library; "
                         "compare at a rate both serve (workload.requests.rate below both capacities, "
                         "or +experiment=deployment_search)"}
