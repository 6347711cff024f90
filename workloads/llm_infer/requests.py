"""Request arrivals and lengths: Poisson / Gamma processes or a CSV trace; fixed / uniform /
lognormal lengths. Generated once from the seed, so every library sees the same requests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from stratacl.errors import ConfigError
from stratacl.schemas.llm_infer import RequestsConfig


@dataclass(frozen=True)
class Requests:
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray

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
        return _from_csv(cfg.csv)
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
        raise ConfigError("workload.requests.arrival", f"unknown '{cfg.arrival}'", "poisson, gamma or csv")
    t = np.cumsum(gaps)
    t = t[t < cfg.duration_s]
    n = len(t)
    inp = _lengths(len_rng, n_max, cfg.input_dist, cfg.input_mean, cfg.input_min, cfg.input_max, cfg.input_sigma, "input")
    out = _lengths(len_rng, n_max, cfg.output_dist, cfg.output_mean, cfg.output_min, cfg.output_max,
                   cfg.output_sigma, "output")
    return Requests(t, inp[:n], out[:n])


# Request tables: a user CSV (arrival_s,input_tokens,output_tokens) or a bundled public trace
# (arrived_at,num_prefill_tokens,num_decode_tokens; traces/README.md)
COLUMNS = (("arrival_s", "input_tokens", "output_tokens"),
           ("arrived_at", "num_prefill_tokens", "num_decode_tokens"))
TRACES_DIR = Path(__file__).parent / "traces"


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
