"""The Mooncake trace's prefix-block structure, bundled compactly (traces/README.md).

The release's `hash_ids` name each request's 512-token prompt blocks by a hash of the prefix up to
and including the block (identical ids are reusable KV). In `conversation_trace.jsonl` ids are
remapped so that a never-seen block takes the next integer, and an earlier id only ever repeats as
a prefix of a request's list (both checked by `encode`). So request i's list is exactly
`parent's first `shared` ids + fresh ids`, where `parent` is the earlier request in which the last
shared id first appeared at the same position; three small integer columns per request (n_blocks,
parent, shared) reproduce every list (36 KB compressed instead of the 3 MB JSON).

Build the bundle: `python -m workloads.llm_infer.prefix_trace <conversation_trace.jsonl> <out.npz>`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

BLOCK_TOKENS = 512  # the release's block size (Mooncake FAST25-release/README: 512 tokens per hash)
TRACES_DIR = Path(__file__).parent / "traces"
BUNDLES = {"mooncake_conv": "mooncake_conv_blocks.npz"}  # trace name -> its block structure


def encode(lists: list[list[int]]) -> dict[str, np.ndarray]:
    """(n_blocks, parent, shared) per request; raises ValueError if the ids are not in the
    release's form (fresh ids sequential, repeats a prefix of an earlier request's list)."""
    first: dict[int, tuple[int, int]] = {}  # id -> (request, position) of its first appearance
    fresh = 0
    n = len(lists)
    n_blocks, parent, shared = np.zeros(n, np.int32), np.full(n, -1, np.int32), np.zeros(n, np.int32)
    for i, ids in enumerate(lists):
        k = 0
        while k < len(ids) and ids[k] in first:
            k += 1
        if k:
            p, pos = first[ids[k - 1]]
            if pos != k - 1 or list(lists[p][:k]) != list(ids[:k]):
                raise ValueError(f"request {i}: its repeated blocks are not an earlier request's prefix")
            parent[i], shared[i] = p, k
        for j, h in enumerate(ids[k:], start=k):
            if h != fresh:
                raise ValueError(f"request {i} block {j}: id {h} is neither a prefix repeat nor the next fresh id")
            first[h] = (i, j)
            fresh += 1
        n_blocks[i] = len(ids)
    return {"n_blocks": n_blocks, "parent": parent, "shared": shared}


def decode(n_blocks: np.ndarray, parent: np.ndarray, shared: np.ndarray) -> list[np.ndarray]:
    """Every request's block ids from the three columns (the inverse of `encode`)."""
    out: list[np.ndarray] = []
    fresh = 0
    for nb, p, k in zip(n_blocks.tolist(), parent.tolist(), shared.tolist(), strict=True):
        head = out[p][:k] if k else np.zeros(0, np.int64)
        out.append(np.concatenate([head, np.arange(fresh, fresh + nb - k, dtype=np.int64)]))
        fresh += nb - k
    return out


def load(trace: str) -> list[np.ndarray] | None:
    """The bundled block ids of a public trace, in its request order; None if it has none."""
    name = BUNDLES.get(str(trace))
    if name is None:
        return None
    with np.load(TRACES_DIR / name) as z:
        return decode(z["n_blocks"], z["parent"], z["shared"])


def read_jsonl(path: Path) -> list[list[int]]:
    with open(path) as f:
        return [json.loads(line)["hash_ids"] for line in f if line.strip()]


def main(argv: list[str]) -> None:
    src, dst = Path(argv[0]), Path(argv[1])
    lists = read_jsonl(src)
    cols = encode(lists)
    assert all(np.array_equal(a, b) for a, b in zip(decode(**cols), lists, strict=True))
    np.savez_compressed(dst, **cols)
    print(f"{len(lists)} requests, {sum(map(len, lists))} blocks -> {dst} ({dst.stat().st_size} bytes)")


if __name__ == "__main__":
    main(sys.argv[1:])
