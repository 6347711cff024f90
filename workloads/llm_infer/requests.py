"""Request arrivals and lengths: Poisson / Gamma processes or a CSV trace; fixed / uniform /
lognormal lengths. Generated once from the seed, so every library sees the same requests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from stratacl.errors import ConfigError
from workloads.llm_infer import prefix_trace
from workloads.llm_infer.schema import RequestsConfig


@dataclass(frozen=True)
class Requests:
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    # each request's prompt-block ids (prefix_trace.py: 512-token blocks, identical ids reusable),
    # when the trace carries them
    block_ids: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)


def _lengths(rng: np.random.Generator, n: int, dist: str, mean: int, lo: int, hi: int, sigma: float,
             field: str) -> np.ndarray:
    if not 0 < lo <= mean <= hi:
        raise ConfigError(f"workload.requests.{field}_mean", f"need 0 < {field}_min ≤ mean ≤ max, "
                          f"got {lo} ≤ {mean} ≤ {hi}")
    if dist == "fixed":
        x = np.full(n, float(mean))
    elif dist == "uniform":
        half = min(mean - lo, hi - mean)
        x = rng.uniform(mean - half, mean + half, n)
    elif dist == "lognormal":
        mu = np.log(mean) - sigma**2 / 2  # so that E[x] = mean before clipping
        x = rng.lognormal(mu, sigma, n)
    else:
        raise ConfigError(f"workload.requests.{field}_dist", f"unknown '{dist}'", "fixed, uniform or lognormal")
    return np.clip(np.rint(x), lo, hi).astype(np.int64)


def generate(cfg: RequestsConfig, seed: int, rate: float | None = None) -> Requests:
    rate = cfg.rate if rate is None else rate
    if cfg.arrival == "csv":
        return _served_rows(_from_csv(cfg.csv), cfg)
    if cfg.arrival == "trace":
        return from_trace(cfg, rate)
    if not rate > 0:
        raise ConfigError("workload.requests.rate", f"must be positive, got {rate}")
    if not cfg.duration_s > 0:
        raise ConfigError("workload.requests.duration_s", f"must be positive, got {cfg.duration_s}")
    # separate streams: request i has the same lengths at every rate (only its arrival moves)
    gap_rng, len_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    rng = gap_rng
    n_max = int(rate * cfg.duration_s * 1.5 + 50)
    if cfg.arrival == "poisson":
        gaps = rng.exponential(1.0 / rate, n_max)
    elif cfg.arrival == "gamma":
        if not cfg.burstiness > 0:
            raise ConfigError("workload.requests.burstiness", "must be positive")
        shape = 1.0 / cfg.burstiness  # CV² = burstiness; mean gap 1/rate
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n_max)
    else:
        raise ConfigError("workload.requests.arrival", f"unknown '{cfg.arrival}'", "poisson, gamma, csv or trace")
    t = np.cumsum(gaps)
    t = t[t < cfg.duration_s]
    n = len(t)
    inp = _lengths(len_rng, n_max, cfg.input_dist, cfg.input_mean, cfg.input_min, cfg.input_max, cfg.input_sigma, "input")
    out = _lengths(len_rng, n_max, cfg.output_dist, cfg.output_mean, cfg.output_min, cfg.output_max,
                   cfg.output_sigma, "output")
    return Requests(t, inp[:n], out[:n])


def pool(cfg: RequestsConfig, seed: int, n: int) -> Requests:
    """`n` requests' lengths from the run's source in order, for a closed loop (arrival times are
    set by the loop): a trace or table cycled from its start, or the length distributions."""
    if cfg.arrival in ("trace", "csv"):
        full = (read_table(TRACES_DIR / f"{cfg.trace}.csv", "workload.requests.trace") if cfg.arrival == "trace"
                else _from_csv(cfg.csv))
        idx = np.arange(n) % len(full)
        ids = prefix_trace.load(cfg.trace) if cfg.arrival == "trace" else None
        if ids is not None:  # a later pass over the trace is other users: its blocks are its own
            top = 1 + max(int(x.max(initial=-1)) for x in ids)
            ids = [ids[i % len(ids)] + top * (i // len(ids)) for i in range(n)]
        return Requests(np.zeros(n), full.input_tokens[idx], full.output_tokens[idx], ids)
    len_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1])  # generate()'s length stream
    inp = _lengths(len_rng, n, cfg.input_dist, cfg.input_mean, cfg.input_min, cfg.input_max, cfg.input_sigma, "input")
    out = _lengths(len_rng, n, cfg.output_dist, cfg.output_mean, cfg.output_min, cfg.output_max,
                   cfg.output_sigma, "output")
    return Requests(np.zeros(n), inp, out)


# Request tables: a user CSV (arrival_s,input_tokens,output_tokens) or a bundled public trace
# (arrived_at,num_prefill_tokens,num_decode_tokens; traces/README.md)
COLUMNS = (("arrival_s", "input_tokens", "output_tokens"),
           ("arrived_at", "num_prefill_tokens", "num_decode_tokens"))
TRACES_DIR = Path(__file__).parent / "traces"


def from_trace(cfg: RequestsConfig, rate: float) -> Requests:
    """A bundled public trace over `duration_s`: its own arrival times (`recorded`), or its first
    rate·duration requests with their gaps scaled by one factor so that exactly that many arrive in
    the window (`scaled`: order, lengths and relative burstiness are the trace's)."""
    full = read_table(TRACES_DIR / f"{cfg.trace}.csv", "workload.requests.trace")
    t = full.arrival_s - full.arrival_s[0]
    if cfg.trace_timing == "scaled":
        n = max(1, round(rate * cfg.duration_s))
        if n >= len(t):
            raise ConfigError("workload.requests.rate", f"trace '{cfg.trace}' holds {len(t)} requests, fewer "
                              f"than {rate} req/s × {cfg.duration_s} s",
                              f"rate × duration_s below {len(t)}, or trace_timing=recorded")
        t = t * (cfg.duration_s / t[n]) if t[n] > 0 else t  # the (n+1)-th request lands at the window's end
    keep = t < cfg.duration_s
    if not keep.any():
        raise ConfigError("workload.requests.duration_s", f"no request of trace '{cfg.trace}' arrives "
                          f"within {cfg.duration_s} s", "a longer duration or a higher rate")
    ids = prefix_trace.load(cfg.trace)
    return Requests(t[keep], full.input_tokens[keep], full.output_tokens[keep],
                    None if ids is None else [ids[i] for i in np.flatnonzero(keep)])


def describe(reqs: Requests, cfg: RequestsConfig, duration_s: float) -> str:
    """What the run really served: source, count, the effective rate and the mean lengths."""
    source = {"csv": f"table {cfg.csv}", "trace": f"trace {cfg.trace} ({cfg.trace_timing})"}.get(
        str(cfg.arrival), f"{cfg.arrival} arrivals")
    if cfg.arrival == "csv" and cfg.csv_window == "duration":
        source += f" (its rows arriving before duration_s = {cfg.duration_s:g} s)"
    # generated arrivals span the configured window; a user's table spans its own arrivals
    span = float(np.ptp(reqs.arrival_s)) if cfg.arrival == "csv" else duration_s
    rate = f"{len(reqs) / span:.2f} req/s" if span > 0 else "all at once"
    return (f"{len(reqs)} requests from {source} over {span:.1f} s = {rate}; "
            f"mean input {reqs.input_tokens.mean():.0f} / output {reqs.output_tokens.mean():.0f} tokens")


def _served_rows(full: Requests, cfg: RequestsConfig) -> Requests:
    """A table's rows the run serves: all of them, or those arriving before duration_s
    (csv_window=duration, as generated arrivals stop at duration_s)."""
    if cfg.csv_window != "duration":
        return full
    keep = full.arrival_s < cfg.duration_s
    return Requests(full.arrival_s[keep], full.input_tokens[keep], full.output_tokens[keep])


def window_end(reqs: Requests, cfg: RequestsConfig) -> float:
    """End of the measured window: a user's table's last arrival (csv_window=table), otherwise
    duration_s (the window arrivals are generated or cut to)."""
    if cfg.arrival == "csv" and cfg.csv_window == "table":  # just past the last arrival: [t0, end) holds it
        return float(np.nextafter(reqs.arrival_s.max(initial=0.0), np.inf))
    return cfg.duration_s


def window_start(arrival_s: np.ndarray, warmup_s: float, end_s: float) -> float:
    """Start of the measured window: warmup_s, or 0 when no request arrives after the warm-up
    inside the window (a run's notes say which)."""
    return warmup_s if warmup_s < end_s and bool((np.asarray(arrival_s) >= warmup_s).any()) else 0.0


def window_note(reqs: Requests, cfg: RequestsConfig, warmup_s: float) -> str:
    """The window a run's statistics cover, in words."""
    end = window_end(reqs, cfg)
    t0 = window_start(reqs.arrival_s, warmup_s, end)
    table = cfg.arrival == "csv" and cfg.csv_window == "table"
    until = "the table's last arrival" if table else "requests.duration_s"
    after = f"after the {warmup_s:g} s warm-up" if t0 == warmup_s else \
        f"from 0 s: no request arrives after the {warmup_s:g} s warm-up"
    return f"statistics over requests arriving in [{t0:g}, {end:g}{']' if table else ')'} s ({after}, to {until})"


def check_table(cfg: RequestsConfig, warmup_s: float, prefix: str = "workload") -> None:
    """A request table readable, and with requests arriving inside its measured window."""
    if not cfg.csv:
        raise ConfigError(f"{prefix}.requests.csv", "arrival=csv but no table is given",
                          "workload.requests.csv=<path> (columns arrival_s,input_tokens,output_tokens)")
    full = _from_csv(cfg.csv)
    last = float(full.arrival_s.max())
    if cfg.csv_window == "table" and not warmup_s < last:
        raise ConfigError(f"{prefix}.warmup_s", f"{warmup_s:g} s is not shorter than the table's span: its last "
                          f"request arrives at {last:g} s, so none would arrive inside the measured window",
                          f"a warmup_s below {last:g} s (e.g. {prefix}.warmup_s=0), or a longer table")
    if cfg.csv_window == "duration" and not ((full.arrival_s >= warmup_s) & (full.arrival_s < cfg.duration_s)).any():
        raise ConfigError(f"{prefix}.requests.duration_s", f"no row of '{cfg.csv}' arrives in the measured window "
                          f"[{warmup_s:g}, {cfg.duration_s:g}) s (its arrivals span {full.arrival_s.min():g} to "
                          f"{last:g} s)", "requests.csv_window=table, or a window over the table's arrivals")


def _from_csv(path: str) -> Requests:
    p = Path(path)
    if not p.is_file():
        raise ConfigError("workload.requests.csv", f"no file '{path}'", "give a CSV with columns "
                          "arrival_s,input_tokens,output_tokens")
    return read_table(p, "workload.requests.csv")


def read_table(path: Path, field: str) -> Requests:
    """Read and check a request table; a bad cell is reported by row (1-based, after the header)
    and column, so a user can find it."""
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError, OSError) as exc:
        raise ConfigError(field, f"unreadable request table '{path}': {' '.join(str(exc).split())}",
                          "a CSV with columns arrival_s,input_tokens,output_tokens") from None
    cols = next((c for c in COLUMNS if set(c) <= set(df.columns)), None)
    if cols is None:
        raise ConfigError(field, f"'{path}' has columns {list(df.columns)[:6]}",
                          "columns arrival_s,input_tokens,output_tokens")
    if len(df) == 0:
        raise ConfigError(field, f"'{path}' has no requests", "at least one row")
    values = []
    for col, integer in zip(cols, (False, True, True), strict=True):
        cells = df[col].str.strip()
        num = pd.to_numeric(cells, errors="coerce")
        bad = ~np.isfinite(num.to_numpy(float)) | (num.to_numpy(float) < (1 if integer else 0))
        if integer:
            bad |= np.asarray(num.fillna(0) % 1 != 0)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            need = "a positive integer" if integer else "a finite number ≥ 0"
            raise ConfigError(field, f"'{path}' row {row + 1}, column '{col}': {cells.iloc[row]!r} is not {need}",
                              "fix or drop that row")
        values.append(num.to_numpy(float))
    order = np.argsort(values[0], kind="stable")
    return Requests(values[0][order], values[1][order].astype(np.int64), values[2][order].astype(np.int64))
