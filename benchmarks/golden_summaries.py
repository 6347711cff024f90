"""Run every default workload and every named experiment; hash each summary.json.

A refactor that must not move results is checked by running this before and after
and diffing the manifests:

    python benchmarks/golden_summaries.py --out /tmp/golden_before
    ...change the code...
    python benchmarks/golden_summaries.py --out /tmp/golden_after --compare /tmp/golden_before

The manifest (`manifest.json`) maps each run's summary.json (relative path) to its sha256;
`--compare` prints the runs whose summary differs, with the first differing keys.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

WORKLOADS = ["collectives", "moe", "llm_infer", "llm_train", "dlrm_train", "interference"]
EXPERIMENTS_DIR = Path(__file__).resolve().parents[1] / "conf" / "experiment"


def _is_multirun(experiment: str) -> bool:
    return "sweeper:" in (EXPERIMENTS_DIR / f"{experiment}.yaml").read_text()


def cases() -> list[tuple[str, list[str], bool]]:
    """(name, overrides, multirun) for every default workload and named experiment."""
    out = [(f"workload_{w}", [f"workload={w}"], False) for w in WORKLOADS]
    for path in sorted(EXPERIMENTS_DIR.glob("*.yaml")):
        out.append((f"experiment_{path.stem}", [f"+experiment={path.stem}"], _is_multirun(path.stem)))
    return out


def run_case(out: Path, name: str, overrides: list[str], multirun: bool) -> float:
    target = out / name
    cmd = [sys.executable, "-m", "stratacl.run", *(["--multirun"] if multirun else []), *overrides,
           "output.progress=false"]
    if multirun:
        cmd += [f"hydra.sweep.dir={target}"]
    else:
        cmd += [f"hydra.run.dir={target}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        (out / f"{name}.err").write_text(proc.stdout + proc.stderr)
        print(f"FAILED {name} (rc={proc.returncode}); see {out / name}.err", flush=True)
    return time.perf_counter() - t0


def manifest(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("summary.json"))
    }


def _flat(d: object, prefix: str = "") -> dict[str, object]:
    if isinstance(d, dict):
        flat: dict[str, object] = {}
        for k, v in d.items():
            flat.update(_flat(v, f"{prefix}{k}."))
        return flat
    return {prefix.rstrip("."): d}


def compare(out: Path, ref: Path, only: list[str] | None = None) -> int:
    """Print the summaries that differ from `ref`'s manifest (within the cases in `only`)."""
    mine, theirs = manifest(out), json.loads((ref / "manifest.json").read_text())
    if only:
        mine = {k: v for k, v in mine.items() if k.split("/")[0] in only}
        theirs = {k: v for k, v in theirs.items() if k.split("/")[0] in only}
    differ = 0
    for key in sorted(set(mine) | set(theirs)):
        if mine.get(key) == theirs.get(key):
            continue
        differ += 1
        if key not in mine or key not in theirs:
            print(f"{key}: only in {'after' if key in mine else 'before'}")
            continue
        a = _flat(json.loads((ref / key).read_text()))
        b = _flat(json.loads((out / key).read_text()))
        keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        print(f"{key}: {len(keys)} values differ")
        for k in keys[:8]:
            print(f"    {k}: {a.get(k)} -> {b.get(k)}")
    print(f"{len(mine)} summaries, {differ} differ from {ref}")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare", type=Path, help="a directory written earlier by this script")
    ap.add_argument("--only", nargs="*", help="run only these case names")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, overrides, multirun in cases():
        if args.only and name not in args.only:
            continue
        wall = run_case(args.out, name, overrides, multirun)
        print(f"{name}: {wall:.1f} s", flush=True)
    (args.out / "manifest.json").write_text(json.dumps(manifest(args.out), indent=1))
    return compare(args.out, args.compare, args.only) if args.compare else 0


if __name__ == "__main__":
    sys.exit(main())
