"""REFERENCE §5 "SDMA offload: core occupancy −95 %+, operator latency +9 %" as validation rows.

The `+experiment=sdma_tradeoff` shape run in process: stratacl (device-triggered SDMA) against
stratacl_no_sdma (the same library, vector cores moving the data), both on the full mesh, 32 ranks, each collective alone
on an idle CloudMatrix384 at the 15 sizes 64 KiB – 1 GiB (stratacl.validate.ascend.collective_runs).

Aggregate (the harness's band convention): per collective, the geometric mean over the sizes of
stratacl / stratacl_no_sdma, minus 1 — of the operator time (latency change) and of the
vector-core-seconds the op holds (occupancy change).

Calibrate/check rule, fixed before fitting: the allgather rows calibrate, the allreduce rows check.
Two allgather rows identify the two unknown SDMA costs of the device trigger (no public figure):
the occupancy change sets `die.sdma.descriptor_us.device` (cores are held only while they write
descriptors, so it alone moves occupancy), then the latency change sets `die.sdma.startup_us`
(engine start-up holds no core, it adds latency only). "−95 %+" is a bound: its fitted write
time is the largest consistent with it. The 64 KiB occupancy row is a further check (the bound
read per size at the size least favourable to SDMA). `python -m stratacl.validate.sdma_row [--fit]`.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable, Sequence

from stratacl.validate.ascend import collective_runs
from stratacl.validate.reference_rows import RefRow, table

KiB = 1024.0
MiB = 1024.0 * KiB
SIZES = tuple(64 * KiB * 2**k for k in range(15))  # 64 KiB – 1 GiB (REFERENCE §5 microbenchmarks)
SDMA, CORES = "stratacl", "stratacl_no_sdma"
# the paper's ablation moves the same one-step full mesh with or without SDMA: both forced to it (the
# presets' own choice would compare different algorithms where the vector-core path is core-bound)
ALGORITHM = "fullmesh"
CALIBRATE = "allgather"  # the rule: allgather rows calibrate, allreduce rows check
CHECK = "allreduce"
LATENCY, OCCUPANCY = 0.09, -0.95
WHAT = "StrataCL SDMA offload vs the same library on vector cores (REFERENCE §5, StrataCL paper)"
DEVICE = "fabric.die.sdma.descriptor_us.device"
STARTUP = "fabric.die.sdma.startup_us"


def per_size(coll: str, overrides: Sequence[str] = ()) -> list[tuple[float, float]]:
    """(time ratio, vector-core-seconds ratio) stratacl / stratacl_no_sdma at each size."""
    sdma = collective_runs(SDMA, coll, SIZES, ALGORITHM, overrides=overrides)
    cores = collective_runs(CORES, coll, SIZES, ALGORITHM, overrides=overrides)
    return [(a[0] / b[0], a[1] / b[1]) for a, b in zip(sdma, cores, strict=True)]


def changes(coll: str, overrides: Sequence[str] = ()) -> tuple[float, float]:
    """(latency change, occupancy change): geometric means over SIZES of the ratios, minus 1."""
    ratios = per_size(coll, overrides)
    geo = [math.exp(sum(math.log(r[i]) for r in ratios) / len(ratios)) - 1.0 for i in (0, 1)]
    return geo[0], geo[1]


def rows(overrides: Sequence[str] = ()) -> list[RefRow]:
    out: list[RefRow] = []
    for coll in (CALIBRATE, CHECK):
        role = "calibrate" if coll == CALIBRATE else "check"
        lat, occ = changes(coll, overrides)
        out.append(RefRow(f"sdma_latency_{coll}", "sdma offload", role, LATENCY, lat, "fraction",
                          f"{WHAT}: operator latency +9 % ({coll}, geomean over 64 KiB-1 GiB)",
                          missing="engine-side costs (per-descriptor fetch, notify wait) not priced",
                          sets=f"{STARTUP.removeprefix('fabric.')}" if role == "calibrate" else ""))
        out.append(RefRow(f"sdma_occupancy_{coll}", "sdma offload", role, OCCUPANCY, occ, "fraction",
                          f"{WHAT}: core occupancy -95 %+ ({coll} vector_core_s, geomean over 64 KiB-1 GiB)",
                          missing="descriptor writes hold the submit cores longer than the paper's",
                          sets=f"{DEVICE.removeprefix('fabric.')}" if role == "calibrate" else ""))
    # the latency read where both movers are bound by the UB ports, not by start-ups (the issue's
    # "≥ 1 MiB" view of the same ablation); a check, nothing is fitted on it
    big = [r[0] for size, r in zip(SIZES, per_size(CALIBRATE, overrides), strict=True) if size >= MiB]
    out.append(RefRow(f"sdma_latency_{CALIBRATE}_from_1MiB", "sdma offload", "check", LATENCY,
                      math.exp(sum(math.log(r) for r in big) / len(big)) - 1.0, "fraction",
                      f"{WHAT}: operator latency +9 % read over 1 MiB-1 GiB only ({CALIBRATE} geomean)",
                      missing="from 1 MiB both movers are bound by the UB ports (SDMA engines 800 GB/s, "
                              "24 cores 186 GB/s, tiers 150-170 GB/s): +9 % there needs an SDMA cost that "
                              "grows with the bytes (a per-descriptor engine fetch, or DMA remote writes "
                              "below the cores'), which no source gives"))
    small = per_size(CALIBRATE, overrides)[0][1] - 1.0
    out.append(RefRow(f"sdma_occupancy_{CALIBRATE}_64KiB", "sdma offload", "check", OCCUPANCY, small, "fraction",
                      f"{WHAT}: core occupancy -95 %+ read at the smallest size ({CALIBRATE} 64 KiB)",
                      missing="at 64 KiB the 4 submit cores write ~60 descriptors for longer than the "
                              "24 vector cores take to move the data; descriptor batching/templates not modelled"))
    return out


def _bisect(f: Callable[[float], float], lo: float, hi: float, iters: int = 20) -> float:
    """Root of a monotone f on [lo, hi] (f(lo), f(hi) of opposite signs; else the nearer end)."""
    flo = f(lo)
    if flo * f(hi) > 0:
        return lo if abs(flo) < abs(f(hi)) else hi
    for _ in range(iters):
        mid = (lo + hi) / 2
        if (f(mid) > 0) == (flo > 0):
            lo, flo = mid, f(mid)
        else:
            hi = mid
    return (lo + hi) / 2


def fit(device_us: float = 0.5, startup_us: float = 1.0, rounds: int = 2) -> tuple[float, float]:
    """(descriptor_us.device, startup_us) fitted on the allgather (calibration) rows only."""
    def occupancy(d: float, s: float) -> float:
        return changes(CALIBRATE, (f"{DEVICE}={d}", f"{STARTUP}={s}"))[1] - OCCUPANCY

    def latency(d: float, s: float) -> float:
        return changes(CALIBRATE, (f"{DEVICE}={d}", f"{STARTUP}={s}"))[0] - LATENCY

    for _ in range(rounds):
        device_us = _bisect(functools.partial(lambda s, d: occupancy(d, s), startup_us), 0.01, 5.0)
        startup_us = _bisect(functools.partial(latency, device_us), 0.0, 50.0)
    return device_us, startup_us


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="fit the two knobs on the calibration rows and print them")
    args = ap.parse_args(argv)
    print(table(rows()))
    if args.fit:
        d, s = fit()
        print(f"\nfitted on the {CALIBRATE} rows: die.sdma.descriptor_us.device = {d:.3f} us, "
              f"die.sdma.startup_us = {s:.2f} us")


if __name__ == "__main__":
    main()
