"""How far to trust a verdict: the check groups of the run's fabric and their errors when
`python -m stratacl.validate --trust` last wrote them (stratacl/validate/trust.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TRUST = Path(__file__).resolve().parent.parent / "data" / "validation" / "trust.json"


def load(path: Path = TRUST) -> dict[str, Any] | None:
    """The saved groups, or None when there is no readable file."""
    try:
        doc = json.loads(path.read_text())
        return doc if isinstance(doc.get("groups"), list) else None
    except (OSError, ValueError, AttributeError):
        return None


# groups a workload's numbers do not rest on, by words of their names (the rest of the fabric's count)
UNRELATED = {
    "dlrm_train": ("moe", "fused", "decode layer", "deepep", "attention"),
    "collectives": ("moe", "fused", "decode layer", "deepep", "attention", "gemm", "elementwise", "interference"),
    "moe": ("decode layer", "attention", "gemm", "elementwise", "interference", "full mesh", "staging", "scaling"),
}


def fabric_groups(fabric: str, doc: dict[str, Any], role: str = "check", workload: str = "") -> list[dict[str, Any]]:
    """The `role` groups whose rows run on `fabric` and bear on `workload`, the worst median first."""
    skip = UNRELATED.get(workload, ())
    out = [g for g in doc["groups"] if fabric in g.get("fabrics", []) and g.get("role") == role
           and not any(w in str(g["group"]).lower() for w in skip)]
    return sorted(out, key=lambda g: (g.get("error", "relative") == "relative", -float(g["median_abs_error"])))


def _err(group: dict[str, Any], key: str) -> str:
    """A relative error as a percentage, a ratio row's absolute error as ± the ratio."""
    v, kind = float(group[key]), group.get("error")
    return {"absolute": f"±{v:.2f} in the ratio", "mixed": f"{v:.2f} (ratio rows ±, the rest relative)"}.get(
        str(kind), f"{v:.1%}")


def trust_lines(fabric: str, workload: str = "", path: Path = TRUST, limit: int = 8) -> list[str]:
    """`trust:` lines: each check group on the run's fabric with its median / worst |error|, worst
    first (the groups of ratio rows, whose error is absolute, ahead of the relative ones); or that
    nothing checks that fabric."""
    doc = load(path)
    if doc is None:
        return [f"trust: no validation file ({path.name}): run python -m stratacl.validate --trust --operators"]
    groups = fabric_groups(fabric, doc, workload=workload)
    if not groups:
        return [f"trust: no check rows run on {fabric}: no public measurement checks these numbers"]
    cells = [f"{g['group']} {_err(g, 'median_abs_error')} median / {_err(g, 'worst_abs_error')} worst ({g['rows']} rows)"
             for g in groups[:limit]]
    more = f"; {len(groups) - limit} more groups" if len(groups) > limit else ""
    head = f"trust (check rows on {fabric}, |error| vs public measurements, from `{doc.get('written_by', '')}`):"
    return [head, *[f"    {c}" for c in cells]] + ([f"   {more[1:]}"] if more else [])
