"""Print a model's layer costs: `python -m workloads.modelcost --model deepseek_v4_flash`."""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from .attention import ATTENTION_MODES
from .config import load_model_yaml
from .costs import ModelCosts
from .errors import CostInputError, ModelConfigError

DEFAULT_SHAPES = [
    {"tokens": 4096, "phase": "prefill"},
    {"tokens": 64, "context": 4096, "phase": "decode"},
    {"tokens": 4096, "phase": "train_fwd"},
    {"tokens": 4096, "phase": "train_bwd"},
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="deepseek_v4_flash", help="name of a conf/model/*.yaml")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--attention", choices=ATTENTION_MODES, default=None,
                   help="production kernels (default) or transformers' reference computation")
    raw = sys.argv[1:] if argv is None else argv
    # Accept the Hydra-style `model=<name>` as well as `--model <name>`.
    flat: list[str] = []
    for a in raw:
        flat += ["--model", a.split("=", 1)[1]] if a.startswith("model=") else [a]
    args = p.parse_args(flat)
    try:
        mc = ModelCosts(load_model_yaml(args.model), attention=args.attention)
        table = mc.costs_table([{**s, "tp": args.tp, "ep": args.ep} for s in DEFAULT_SHAPES])
    except (ModelConfigError, CostInputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.model}: {mc.total_params() / 1e9:.2f} B params, layer types {mc.layer_types()}, "
          f"attention {mc.attention}")
    print(f"KV bytes/token {mc.kv_bytes_per_token()}, activation bytes/token {mc.activation_bytes_per_token()}")
    for col in ("cube_flops", "vector_flops"):
        table[col] = table[col] / 1e9
    for col in ("hbm_bytes", "hbm_bytes_fused", "weight_bytes", "activation_bytes_out"):
        table[col] = table[col] / 2**20
    table = table.rename(columns={"cube_flops": "cube_GF", "vector_flops": "vec_GF", "hbm_bytes": "hbm_MiB",
                                  "hbm_bytes_fused": "fused_MiB", "weight_bytes": "w_MiB",
                                  "activation_bytes_out": "act_out_MiB"})
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.2f}".format):
        print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
