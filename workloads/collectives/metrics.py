"""What the collectives sweep's metrics mean for a verdict: operator time per size band leads."""

from __future__ import annotations

from stratacl.directions import MetricInfo, metric
from stratacl.metrics import SIZE_BANDS, band_range

METRICS: dict[str, MetricInfo] = {
    "busbw_GBps_mean": metric("higher", "GB/s", "busbw, mean over sizes"),
    "time_s_total": metric("lower", "s", "operator time, summed over sizes"),
    # the collectives verdict: operator time per size band, geometric mean over the band's sizes
    **{f"{band}_op_time_s": metric("lower", "s", f"operator time, {band} ({band_range(band)}), geomean over sizes",
                               short=f"{band} ({band_range(band)})")
       for band, _, _ in SIZE_BANDS},
}

HEADLINES = tuple(f"{band}_op_time_s" for band, _, _ in SIZE_BANDS)
# the whole-sweep aggregates, which hide the size regimes the bands separate: context, never judged
CONTEXT = ("time_s_total", "busbw_GBps_mean")
