"""What dlrm_train's own metrics mean for a verdict (the training-step ones are the core's)."""

from __future__ import annotations

from stratacl.directions import MEMORY, MetricInfo, metric

METRICS: dict[str, MetricInfo] = {
    "exposed_cache_miss_s": metric("lower", "s", "exposed cache-miss fetch"),
    "cache_traffic_s": metric("lower", "s", "cache traffic"),
    "cache_hit_rate": metric("higher", "fraction", "cache hit rate"),
    "cache_hit_rate_min": metric("higher", "fraction", "min cache hit rate"),
    "cache_GB_per_die": metric("higher", "GB", "embedding cache/die", mechanism=MEMORY),
    "table_GB_per_die_max": metric(None, "GB", "tables/die (max)"),
    "library_memory_GB_per_die": metric("lower", "GB", "library memory/die", mechanism=MEMORY),
    "reserved_GB_per_die_max": metric(None, "GB", "allocator reserved/die (max)"),
    "fragmentation_GB_per_die_max": metric("lower", "GB", "fragmentation/die (max)", mechanism=MEMORY),
    "cache_miss_GB_per_iter_max_die": metric("lower", "GB", "cache misses/iteration (max die)"),
    "dense_allreduce_MB": metric(None, "MB", "dense all-reduce"),
}

HEADLINES = ("iteration_time_s",)
