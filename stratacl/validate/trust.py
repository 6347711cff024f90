"""The validation groups' current errors, saved for the run report (`python -m stratacl.validate --trust`).

Each group of the report (kernel rows, operator rows, the CloudMatrix384 section) with its role,
rows, median and worst |error| and the fabrics its rows run on, written as JSON to
`stratacl/data/validation/trust.json`. The run report (`stratacl/report/trust.py`) prints, beside a
verdict, the check groups of the run's fabric from that file: how far the numbers it rests on were
from public measurements when the file was last written (tests/test_trust.py keeps the kernel
groups in step with the code).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

TRUST = Path(__file__).resolve().parent.parent / "data" / "validation" / "trust.json"


def groups(results: Iterable[tuple[Any, float, float]], section: str,
           fabric: str | None = None) -> list[dict[str, Any]]:
    """One entry per (group, role) of `results` ((row, harness, error) triples whose rows have
    `group`, `role` and — unless `fabric` names it for all — `fabric`)."""
    by: dict[tuple[str, str], list[tuple[Any, float]]] = {}
    for r, _, e in results:
        by.setdefault((r.group, r.role), []).append((r, e))
    out = []
    for (g, role), members in by.items():
        errs = [abs(e) for _, e in members]
        fabrics = sorted({fabric or str(getattr(r, "fabric", "")) for r, _ in members} - {""})
        # reference rows that compare ratios carry an absolute error (harness − target), the rest relative
        ratio = [getattr(r, "unit", "") == "ratio" for r, _ in members]
        kind = "absolute" if all(ratio) else "mixed" if any(ratio) else "relative"
        out.append({"section": section, "group": g, "role": role, "rows": len(errs), "error": kind,
                    "median_abs_error": statistics.median(errs), "worst_abs_error": max(errs), "fabrics": fabrics})
    return out


def write(entries: Sequence[dict[str, Any]], every: bool, path: Path = TRUST) -> Path:
    """The file the report reads: `every` says whether the `--operators` rows were run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"written_by": "python -m stratacl.validate --trust" + (" --operators" if every else ""),
           "groups": list(entries)}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
