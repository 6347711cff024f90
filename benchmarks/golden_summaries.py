"""Run every default workload and every named experiment; hash each summary.json.

A refactor that must not move results is checked by running this before and after
and diffing the manifests:

    python benchmarks/golden_summaries.py --out /tmp/golden_before
    ...change the code...
    python benchmarks/golden_summaries.py --out /tmp/golden_after --compare /tmp/golden_before

The manifest (`manifest.json`) maps each run's summary.json (relative path) to its sha256;
`--compare` prints the runs whose summary differs, with the first differing keys.

`--ci` runs every case at the CI size (`CI` below) and compares with the committed reference
(benchmarks/golden: manifest.json and the reference summaries); it exits 1 on any difference.
`--ci --only CASE ...` runs and compares those cases alone. `--update` rewrites that reference (with `--only`, just those cases): only for a change meant to move results, with the reason
in the commit message.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ["collectives", "moe", "llm_infer", "llm_train", "dlrm_train", "interference"]
EXPERIMENTS_DIR = ROOT / "conf" / "experiment"
GOLDEN = ROOT / "benchmarks" / "golden"

# CI size: each case keeps its workload, libraries and code path (saturation, SLO search, sweeps
# over the same knobs) at shorter windows, fewer layers and fewer sweep points. A command-line
# value of a swept knob replaces the experiment's sweep list (Hydra's basic sweeper).
CI_COMMON = ["output.timeline=false"]
_SERVE = ["workload.requests.duration_s=6", "workload.warmup_s=2",
          "workload.capacity.saturation_duration_s=6", "workload.capacity.saturation_warmup_s=2"]
_TRAIN = ["workload.num_layers=8"]  # three dense layers, then MoE layers (first_k_dense_replace = 3)
CI: dict[str, list[str]] = {
    "workload_collectives": [],
    "workload_moe": [],
    "workload_llm_infer": _SERVE,
    "workload_llm_train": [*_TRAIN, "workload.iterations=[0,2000]"],
    "workload_dlrm_train": [],
    "workload_interference": [],
    "experiment_ablation_inference": _SERVE,
    "experiment_ablation_operators": [],
    "experiment_cloudmatrix_infer": [],
    "experiment_core_spread": [],
    "experiment_deployment_search": [
        *_SERVE, "workload.search.prefill_dp=[16,32]", "workload.search.decode_dp=[16]",
        "workload.search.tbo=[true]", "workload.search.stream_layout=[cloudmatrix_tbo]",
        "workload.search.mtp=[true,false]", "workload.search.decode_max_batch=[0]",
        "workload.search.prefill_token_budget=[8192]", "workload.search.slo_scales=[1.0,2.0]",
        "workload.search.finalists=1", "workload.search.rate_tolerance=0.2"],
    "experiment_dlrm_cache_batch": ["workload.cache_GB_per_die=1,0", "workload.batch_per_worker=256"],
    "experiment_dlrm_multihot_cache": ["workload.cache_GB_per_die=4", "workload.prefetch_pipeline=true,false"],
    "experiment_inference_capacity": [*_SERVE, "workload.capacity.rate_step=2.0"],
    "experiment_inference_pd_ratio": [*_SERVE, "workload.layout.prefill_instances=1,3"],
    "experiment_inference_rates": ["workload.requests.duration_s=6", "workload.warmup_s=2",
                                   "workload.requests.trace=mooncake_conv,azure_code",
                                   "workload.requests.rate=5"],
    "experiment_interference": [],
    "experiment_llm_train_deepseek_v3": ["workload.num_layers=32", "workload.microbatches=32",
                                         "workload.global_batch=4096"],
    "experiment_llm_train_iterations": [*_TRAIN, "workload.iterations=[0,50]"],
    "experiment_llm_train_paper_layout": _TRAIN,
    "experiment_moe_scaling": ["workload.ep=8,64"],
    "experiment_moe_table": [],
    "experiment_nvidia_inference": _SERVE,
    "experiment_nvidia_operators": [],
    "experiment_operators": [],
    "experiment_scaling": ["workload.ranks=32,128"],
    "experiment_sdma_tradeoff": [],
    "experiment_stream_split": ["workload.requests.duration_s=4", "workload.warmup_s=1"],
    "experiment_vector_cores": ["library.hccl_zerocopy.comm_cores=4,48", "library.stratacl_no_sdma.comm_cores=48"],
}


def _is_multirun(experiment: str) -> bool:
    return "sweeper:" in (EXPERIMENTS_DIR / f"{experiment}.yaml").read_text()


def cases() -> list[tuple[str, list[str], bool]]:
    """(name, overrides, multirun) for every default workload and named experiment."""
    out = [(f"workload_{w}", [f"workload={w}"], False) for w in WORKLOADS]
    for path in sorted(EXPERIMENTS_DIR.glob("*.yaml")):
        out.append((f"experiment_{path.stem}", [f"+experiment={path.stem}"], _is_multirun(path.stem)))
    return out


def ci_cases() -> list[tuple[str, list[str], bool]]:
    """The cases at CI size; a case without a CI entry is refused (its full size may not fit CI)."""
    missing = [name for name, _, _ in cases() if name not in CI]
    if missing:
        print(f"error: no CI size for {', '.join(missing)} — fix: add an entry to CI in {Path(__file__).name}",
              file=sys.stderr)
        sys.exit(2)
    return [(name, [*overrides, *CI_COMMON, *CI[name]], multirun) for name, overrides, multirun in cases()]


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
        tail = "\n    ".join(proc.stderr.strip().splitlines()[-3:])
        print(f"FAILED {name} (rc={proc.returncode}); see {out / name}.err\n    {tail}", flush=True)
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


def compare(out: Path, ref: Path, only: list[str] | None = None, theirs: dict[str, str] | None = None) -> int:
    """Print the summaries that differ from `ref`'s (within the cases in `only`).

    `theirs` is the reference's hashes; by default `ref`'s manifest.json, as this script writes it."""
    mine = manifest(out)
    if theirs is None:
        theirs = json.loads((ref / "manifest.json").read_text())
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


def unportable(out: Path) -> list[str]:
    """Summaries that name the run directory or the checkout: their hash would depend on where they ran."""
    marks = {str(out.resolve()), str(ROOT), str(Path.cwd())}
    return [str(p.relative_to(out)) for p in sorted(out.rglob("summary.json"))
            if any(m in p.read_text() for m in marks)]


def _case_list(selected: list[tuple[str, list[str], bool]]) -> dict[str, dict[str, object]]:
    return {name: {"overrides": overrides, "multirun": multirun} for name, overrides, multirun in selected}


def update_reference(out: Path, selected: list[tuple[str, list[str], bool]], only: list[str] | None = None) -> None:
    """Replace benchmarks/golden with this run's summaries and their hashes; with `only`, replace
    just those cases' summaries and keep every other case of the reference as it is."""
    hashes = manifest(out)
    cases = _case_list(selected)
    if only:
        ref = json.loads((GOLDEN / "manifest.json").read_text())
        for name in only:
            if (GOLDEN / name).exists():
                shutil.rmtree(GOLDEN / name)
        kept = {k: v for k, v in ref["summaries"].items() if k.split("/")[0] not in only}
        hashes = {**kept, **hashes}
        cases = {**ref["cases"], **cases}
    elif GOLDEN.exists():
        shutil.rmtree(GOLDEN)
    for rel in manifest(out):
        (GOLDEN / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / rel, GOLDEN / rel)
    ref = {"cases": cases, "summaries": dict(sorted(hashes.items()))}
    (GOLDEN / "manifest.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"wrote {GOLDEN / 'manifest.json'}: {len(hashes)} summaries")


def compare_reference(out: Path, selected: list[tuple[str, list[str], bool]], only: list[str] | None = None) -> int:
    """Compare with benchmarks/golden (the cases in `only`, default all); a case list that differs
    from the reference's is a failure."""
    if not (GOLDEN / "manifest.json").exists():
        print(f"no reference at {GOLDEN / 'manifest.json'} — fix: write one with --ci --update", file=sys.stderr)
        return 2
    ref = json.loads((GOLDEN / "manifest.json").read_text())
    if only:
        ref["cases"] = {n: c for n, c in ref["cases"].items() if n in only}
    if ref["cases"] != _case_list(selected):
        names = sorted(n for n in set(ref["cases"]) | {n for n, _, _ in selected}
                       if ref["cases"].get(n) != _case_list(selected).get(n))
        print(f"the cases or their overrides differ from {GOLDEN / 'manifest.json'}: {', '.join(names)}")
        return 1
    return compare(out, GOLDEN, only, ref["summaries"])


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="where the runs go (required without --ci; a new temporary directory with it)")
    ap.add_argument("--compare", type=Path, help="a directory written earlier by this script")
    ap.add_argument("--only", nargs="*", help="run only these case names")
    ap.add_argument("--ci", action="store_true", help="every case at CI size, compared with benchmarks/golden")
    ap.add_argument("--update", action="store_true",
                    help="with --ci: rewrite benchmarks/golden, or with --only just those cases (only for a change meant to move results)")
    args = ap.parse_args()
    if args.update and not args.ci:
        ap.error("--update rewrites the CI reference: use it with --ci")
    if args.update and args.only and not (GOLDEN / "manifest.json").exists():
        ap.error("--update --only needs a reference to keep the other cases of: run --ci --update first")
    if args.out is None and not args.ci:
        ap.error("--out is required without --ci")
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="golden_ci_"))
    out.mkdir(parents=True, exist_ok=True)
    pool = ci_cases() if args.ci else cases()
    unknown = sorted(set(args.only or ()) - {name for name, _, _ in pool})
    if unknown:
        ap.error(f"unknown cases {unknown}: use names from {[name for name, _, _ in pool]}")
    selected = [c for c in pool if not args.only or c[0] in args.only]
    t0 = time.perf_counter()
    for name, overrides, multirun in selected:
        wall = run_case(out, name, overrides, multirun)
        print(f"{name}: {wall:.1f} s", flush=True)
    print(f"{len(selected)} cases in {time.perf_counter() - t0:.1f} s wall, {_cpu_s():.1f} s CPU; runs in {out}")
    (out / "manifest.json").write_text(json.dumps(manifest(out), indent=1))
    moved = unportable(out)
    if moved:
        print(f"summaries name the run directory or the checkout, so their hashes are not portable: {', '.join(moved)}")
        return 1
    if args.update:
        update_reference(out, selected, args.only)
        return 0
    if args.ci:
        return compare_reference(out, selected, args.only)
    return compare(out, args.compare, args.only) if args.compare else 0


if __name__ == "__main__":
    sys.exit(main())
