"""The cost triple of a kernel group on one rank: cube FLOPs, vector FLOPs, HBM bytes — and, when
measured, its breakdown into the kernels it runs as.

Cube FLOPs are matrix-unit work (matmuls), vector FLOPs element-wise work (softmax, norms,
activations, reductions); the two run on different core types with different peaks, so they are
kept apart all the way to the trace (see `workloads.common.kernels.add_cost`).

`parts`: the same work by kernel class (`KernelClass` values: gemm, grouped_gemm,
attention_prefill, attention_decode, elementwise, routing), each with its FLOPs, the HBM bytes it
is charged and its matmul shapes `gemms` ((m, n, k, count): D[m×n] = A[m×k]·B[k×n], `count`
times). When parts are given they add up to the triple (Σ cube, Σ vector, Σ bytes); a cost with
no parts is priced by the kernel rule's defaults. Arithmetic (sum, difference, scaling,
interpolation) works part by part; a matmul's shapes are not linear in the work, so they follow
it by their row count m (kept real-valued here, rounded to whole rows when a kernel is emitted:
`workloads.common.kernels.emit_gemms`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

# (m, n, k, count), or (m, n, k, count, 1) when the rows a kernel's work follows (tokens, routed rows)
# run along k, not m (a weight gradient contracts over them); the row dimension may be fractional
# until emitted
Gemm = tuple


def gemm_flops(gemms: Iterable[tuple]) -> float:
    """Σ 2·m·n·k·count."""
    return float(sum(2.0 * g[0] * g[1] * g[2] * g[3] for g in gemms))


def scale_rows(g: tuple, k: float) -> tuple:
    """A matmul with its row dimension (m, or k for a weight gradient) times k."""
    if len(g) > 4 and g[4]:
        return (g[0], g[1], g[2] * k, g[3], 1)
    return (g[0] * k, *g[1:])


def fit_gemms(gemms: tuple[Gemm, ...], flops: float) -> tuple[Gemm, ...]:
    """The shapes with every row dimension (`scale_rows`) scaled so that they do `flops`."""
    total = gemm_flops(gemms)
    if flops <= 0 or total <= 0:
        return ()
    k = flops / total
    return tuple(scale_rows(g, k) for g in gemms)


def lerp_gemms(a: tuple[Gemm, ...], b: tuple[Gemm, ...], w: float, flops: float) -> tuple[Gemm, ...]:
    """The matmuls between two measured shapes a (w = 0) and b (w = 1) doing `flops`: when both
    run the same matmuls, each dimension that differs (rows, contraction, batch count, and —
    paired by position when a dimension every matmul keeps differs, such as the keys an attention
    core spans at two contexts — columns) is interpolated, as the shape between them has it (a
    per-token batched matmul grows its count, a token GEMM its rows, an attention core its keys);
    otherwise the nearer end's shapes with their rows fitted. Interpolating only rows would price a
    768-token iteration's per-token 4×4 mixing as 1024 matmuls of 3 rows (the 1024-token end's
    count), and a 24K-context prefill's attention at the 32K end's keys with ~25 % fewer query rows
    (a tile-padding step of +12 % in the iteration between contexts 24,240 and 24,575)."""
    def key(g: Gemm) -> tuple:  # what does not grow with tokens: (n, k), or (m, n) of a weight gradient
        return (g[0], g[1], *g[4:]) if len(g) > 4 and g[4] else (g[1], g[2])
    ka, kb = Counter(map(key, a)), Counter(map(key, b))
    if a and ka == kb and all(n == 1 for n in ka.values()):
        by_b = {key(g): g for g in b}
        return fit_gemms(tuple(_mid(x, by_b[key(x)], w) for x in a), flops)
    if a and len(a) == len(b) and all(x[4:] == y[4:] for x, y in zip(a, b, strict=True)):
        return fit_gemms(tuple(_mid(x, y, w) for x, y in zip(a, b, strict=True)), flops)
    return fit_gemms(a if w <= 0.5 else b, flops) or fit_gemms(b if w <= 0.5 else a, flops)


def _mid(x: Gemm, y: Gemm, w: float) -> Gemm:
    """x + w·(y − x) per dimension: the row dimension (m, or k of a weight gradient) real-valued,
    the others whole, the count at least 1."""
    rows_k = len(x) > 4 and bool(x[4])
    dims = [x[i] + w * (y[i] - x[i]) for i in range(3)]
    dims = [d if i == (2 if rows_k else 0) else max(1, round(d)) for i, d in enumerate(dims)]
    return (*dims, max(1, round(x[3] + w * (y[3] - x[3]))), *x[4:])


def _diff_gemms(a: tuple[Gemm, ...], b: tuple[Gemm, ...], flops: float) -> tuple[Gemm, ...]:
    """a minus b: the multiset difference when b's matmuls are among a's (a core split off a
    layer), else a's shapes fitted to the remaining FLOPs."""
    ca, cb = Counter(a), Counter(b)
    if all(ca[g] >= n for g, n in cb.items()):
        left = tuple(sorted((ca - cb).elements()))
        if abs(gemm_flops(left) - flops) <= 1e-9 * max(flops, 1.0):
            return left
    return fit_gemms(a, flops)


@dataclass(frozen=True)
class Part:
    kernel: str
    cube_flops: float = 0.0
    vector_flops: float = 0.0
    hbm_bytes: float = 0.0
    gemms: tuple[Gemm, ...] = ()

    @property
    def empty(self) -> bool:
        return self.cube_flops <= 0 and self.vector_flops <= 0 and self.hbm_bytes <= 0

    def scale(self, k: float) -> Part:
        return Part(self.kernel, self.cube_flops * k, self.vector_flops * k, self.hbm_bytes * k,
                    fit_gemms(self.gemms, self.cube_flops * k))


def _merge(a: tuple[Part, ...], b: tuple[Part, ...], op) -> tuple[Part, ...]:  # noqa: ANN001
    """Part-by-part combination by kernel class (a class missing on one side counts as zero)."""
    kinds = list(dict.fromkeys([p.kernel for p in a] + [p.kernel for p in b]))
    pa, pb = {p.kernel: p for p in a}, {p.kernel: p for p in b}
    out = []
    for kind in kinds:
        p = op(pa.get(kind, Part(kind)), pb.get(kind, Part(kind)))
        if not p.empty:
            out.append(p)
    return tuple(out)


@dataclass(frozen=True)
class Cost:
    cube_flops: float = 0.0
    vector_flops: float = 0.0
    hbm_bytes: float = 0.0
    parts: tuple[Part, ...] = ()

    def _combine(self, other: Cost, sign: float) -> tuple[Part, ...]:
        if not self.parts and not other.parts:
            return ()
        if (not self.parts and self._nonzero()) or (not other.parts and other._nonzero()):
            return ()  # a measured breakdown does not survive mixing with an unbroken-down cost

        def op(x: Part, y: Part) -> Part:
            c = x.cube_flops + sign * y.cube_flops
            gemms = _sum_gemms(x.gemms, y.gemms, c) if sign > 0 else _diff_gemms(x.gemms, y.gemms, c)
            return Part(x.kernel, c, x.vector_flops + sign * y.vector_flops, x.hbm_bytes + sign * y.hbm_bytes,
                        gemms)

        return _merge(self.parts, other.parts, op)

    def _nonzero(self) -> bool:
        return bool(self.cube_flops or self.vector_flops or self.hbm_bytes)

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.cube_flops + other.cube_flops, self.vector_flops + other.vector_flops,
                    self.hbm_bytes + other.hbm_bytes, self._combine(other, 1.0))

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.cube_flops - other.cube_flops, self.vector_flops - other.vector_flops,
                    self.hbm_bytes - other.hbm_bytes, self._combine(other, -1.0))

    def scale(self, k: float) -> Cost:
        return Cost(self.cube_flops * k, self.vector_flops * k, self.hbm_bytes * k,
                    tuple(p.scale(k) for p in self.parts))

    def clip(self) -> Cost:
        """Negative components (from differencing or extrapolating measurements) set to 0."""
        parts = tuple(p for p in (Part(p.kernel, max(p.cube_flops, 0.0), max(p.vector_flops, 0.0),
                                       max(p.hbm_bytes, 0.0), p.gemms if p.cube_flops > 0 else ())
                                  for p in self.parts) if not p.empty)
        if parts:  # the triple stays the sum of its parts
            return Cost(sum(p.cube_flops for p in parts), sum(p.vector_flops for p in parts),
                        sum(p.hbm_bytes for p in parts), parts)
        return Cost(max(self.cube_flops, 0.0), max(self.vector_flops, 0.0), max(self.hbm_bytes, 0.0))

    def lerp(self, other: Cost, w: float) -> Cost:
        """self + w·(other − self), clipped at 0 (w outside [0, 1] extrapolates). Matmul shapes
        interpolated between the ends (`lerp_gemms`), fitted to the interpolated FLOPs."""
        out = Cost(self.cube_flops + w * (other.cube_flops - self.cube_flops),
                   self.vector_flops + w * (other.vector_flops - self.vector_flops),
                   self.hbm_bytes + w * (other.hbm_bytes - self.hbm_bytes))
        if self.parts and other.parts:
            def op(x: Part, y: Part) -> Part:
                c = x.cube_flops + w * (y.cube_flops - x.cube_flops)
                return Part(x.kernel, c, x.vector_flops + w * (y.vector_flops - x.vector_flops),
                            x.hbm_bytes + w * (y.hbm_bytes - x.hbm_bytes), lerp_gemms(x.gemms, y.gemms, w, c))

            out = replace(out, parts=_merge(self.parts, other.parts, op))
        return out.clip()

    def less_bytes(self, nbytes: float, kernels: tuple[str, ...] = ("grouped_gemm", "gemm")) -> Cost:
        """`nbytes` fewer HBM bytes (never below 0), taken from the parts of `kernels` in that order
        (weights a caller re-adds per die); no parts: from the triple."""
        if not self.parts:
            return Cost(self.cube_flops, self.vector_flops, max(self.hbm_bytes - nbytes, 0.0))
        left, parts = float(nbytes), {p.kernel: p for p in self.parts}
        for k in kernels:
            p = parts.get(k)
            if p is not None and left > 0:
                take = min(left, p.hbm_bytes)
                parts[k] = replace(p, hbm_bytes=p.hbm_bytes - take)
                left -= take
        out = tuple(parts.values())
        return Cost(self.cube_flops, self.vector_flops, sum(p.hbm_bytes for p in out), out)

    def matmuls(self, kernel: str, keep: Callable[[Gemm], bool]) -> Cost:
        """The `kernel` part's matmuls that `keep` selects, with their share of its FLOPs and of
        its bytes (bytes in proportion to FLOPs: at a fixed row count a matmul's weight traffic
        is), e.g. a router's GEMM out of a layer's dense GEMMs. No such part or shapes: zero."""
        part = next((p for p in self.parts if p.kernel == kernel), None)
        total = gemm_flops(part.gemms) if part is not None else 0.0
        if part is None or total <= 0:
            return Cost()
        gemms = tuple(g for g in part.gemms if keep(g))
        w = gemm_flops(gemms) / total
        out = Part(kernel, part.cube_flops * w, part.vector_flops * w, part.hbm_bytes * w, gemms)
        return Cost(out.cube_flops, out.vector_flops, out.hbm_bytes, (out,) if not out.empty else ())

    def only(self, *kernels: str) -> Cost:
        """The part of this cost that runs as the given kernel classes (no parts: zero)."""
        parts = tuple(p for p in self.parts if p.kernel in kernels)
        return Cost(sum(p.cube_flops for p in parts), sum(p.vector_flops for p in parts),
                    sum(p.hbm_bytes for p in parts), parts)


def _sum_gemms(a: tuple[Gemm, ...], b: tuple[Gemm, ...], flops: float) -> tuple[Gemm, ...]:
    """Shapes of a sum: both lists when they account for the FLOPs, else fitted."""
    both = a + b
    if abs(gemm_flops(both) - flops) <= 1e-9 * max(flops, 1.0):
        return both
    return fit_gemms(both, flops)
