"""A corrupt trace file is one clean TraceError, never a raw decoder error or a silently different
trace: every single-byte flip of a saved trace either fails cleanly or loads the same trace."""

from __future__ import annotations

import pytest

from stratacl.errors import TraceError
from stratacl.trace import Trace


def _trace() -> Trace:
    tr = Trace(world_size=4)
    tr.add_family("w", [range(4)])
    c = tr.compute(range(4), flops=1e9, name="gemm")
    tr.collective("dispatch", "w", 4096, peer_bytes=[256.0] * 16, deps=[c], name="disp", buffer="x",
                  moe_mode="ht")
    tr.add("p2p", [0, 1], src=[0], dst=[1], nbytes=1024, name="kv")
    tr.add_buffer("x", c)
    return tr


def test_every_byte_flip_fails_cleanly_or_loads_the_same_trace(tmp_path) -> None:  # noqa: ANN001
    tr = _trace()
    path = tr.save(tmp_path / "t.parquet")
    data = path.read_bytes()
    same = failed = 0
    for i in range(0, len(data), 3):  # every third byte keeps the test fast
        flipped = bytearray(data)
        flipped[i] ^= 0xFF
        bad = tmp_path / "bad.parquet"
        bad.write_bytes(bytes(flipped))
        try:
            loaded = Trace.load(bad)
        except TraceError:
            failed += 1
            continue
        assert (loaded.ops, loaded.communicators, loaded.buffers) == (tr.ops, tr.communicators, tr.buffers), i
        same += 1
    assert failed > 0 and same + failed == len(range(0, len(data), 3))


def test_truncated_file_is_a_trace_error(tmp_path) -> None:  # noqa: ANN001
    path = _trace().save(tmp_path / "t.parquet")
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(TraceError, match="not a readable parquet trace"):
        Trace.load(path)
