"""The workload registry finds every workload package and imports nothing heavy doing so."""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT


def test_every_bundled_workload_is_registered_and_torch_is_not_imported() -> None:
    """Loading the config layer registers each package with a schema (not the shared `common` and
    `modelcost`, whose `__init__` imports torch): a collectives run never pays for torch."""
    code = ("import sys, stratacl.config\n"
            "from stratacl import workload_registry as r\n"
            "print(sorted(r.specs()), 'torch' in sys.modules, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("]")[0] + "]" == str(["collectives", "dlrm_train", "interference", "llm_infer",
                                                  "llm_train", "moe", "replay"])
    assert done.stdout.strip().endswith("False False")
