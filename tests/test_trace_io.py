"""Trace files are data: round trip, validation naming the bad op, corrupt files fail clearly."""

from __future__ import annotations

import dataclasses
import json
import pickle
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stratacl.errors import TraceError
from stratacl.trace import COLLECTIVES, EXCHANGES, HOST_PEERS, KINDS, MOE_COLLS, MoeShape, Trace
from stratacl.vocab import Collective, CopyDirection, CoreKind, HostPeer, OpKind


def small_trace() -> Trace:
    tr = Trace(world_size=8, meta={"workload": "test"})
    tr.add_family("tp", [range(0, 4), range(4, 8)])
    a = tr.compute(range(8), flops=[1e9] * 8, hbm_bytes=1e6, name="attn")
    b = tr.collective("allreduce", "tp", 2**20, deps=[a], buffer="act0", stream="comm")
    tr.collective("alltoallv", "tp", 2**20, peer_bytes=[[0, 1, 2, 3]] * 4, deps=[b])
    tr.add("p2p", [0, 4], src=[0], dst=[4], nbytes=1e6)
    m = tr.add("memcpy", [1, 2], nbytes=[1e5, 2e5])
    tr.add_buffer("act0", alloc_op=a)
    tr.add_buffer("kv", alloc_op=-1)
    assert m == 4
    return tr


def test_round_trip_is_exact(tmp_path) -> None:  # noqa: ANN001
    tr = small_trace()
    tr.validate()
    loaded = Trace.load(tr.save(tmp_path / "t.parquet"))
    assert loaded.ops == tr.ops
    assert loaded.communicators == tr.communicators
    assert loaded.world_size == tr.world_size and loaded.meta == tr.meta
    assert loaded.buffers == {"act0": (0,), "kv": (-1,)}
    assert tr.to_frame().shape[0] == 5


def test_a_trace_built_with_vocabulary_members_equals_the_plain_string_one(tmp_path) -> None:  # noqa: ANN001
    """The StrEnum vocabularies are the strings traces store: ops built with members equal the
    plain-string ops, validate, and load back as plain strings."""
    def build(kind: Callable[[str], str]) -> Trace:
        tr = Trace(world_size=4)
        tr.add_family("tp", [range(4)])
        a = tr.compute(range(4), flops=1e9, core=kind(CoreKind.mixed), vector_flops=1e6)
        tr.collective(kind(Collective.allgather), "tp", 2**20, deps=[a])
        tr.add(kind(OpKind.p2p), [0, 1], src=[0], dst=[1], nbytes=1e3)
        tr.memcpy([2], 1e6, peer=kind(HostPeer.host), direction=kind(CopyDirection.d2h))
        return tr

    members, plain = build(lambda m: m), build(str)
    members.validate()
    assert members.ops == plain.ops
    loaded = Trace.load(members.save(tmp_path / "t.parquet"))
    assert loaded.ops == plain.ops
    assert all(type(op.kind) is str and type(op.coll) is str and type(op.core) is str for op in loaded.ops)
    assert KINDS == ("compute", "collective", "p2p", "memcpy") and HOST_PEERS == ("", "host", "pool")
    assert EXCHANGES == ("alltoall", "alltoallv", "dispatch", "combine") and set(MOE_COLLS) <= set(COLLECTIVES)


def test_truncated_file_fails_clearly(tmp_path) -> None:  # noqa: ANN001
    path = small_trace().save(tmp_path / "t.parquet")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="not a readable parquet trace"):
        Trace.load(path)


def test_garbage_file_fails_clearly(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "g.parquet"
    path.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(TraceError, match="not a readable parquet trace"):
        Trace.load(path)


def test_parquet_without_trace_metadata_is_rejected(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), path)
    with pytest.raises(TraceError, match="format version"):
        Trace.load(path)


class _Boom:
    def __reduce__(self):  # noqa: ANN204
        import os

        return (os.system, ("touch /tmp/stratacl_pickle_executed",))


def test_loading_never_unpickles(tmp_path) -> None:  # noqa: ANN001
    """A pickle payload smuggled into a column and into pandas metadata is never executed."""
    marker = __import__("pathlib").Path("/tmp/stratacl_pickle_executed")
    marker.unlink(missing_ok=True)
    path = small_trace().save(tmp_path / "t.parquet")
    table = pq.read_table(path)
    payload = pickle.dumps(_Boom())
    table = table.append_column("evil", pa.array([payload] * table.num_rows, type=pa.binary()))
    md = dict(table.schema.metadata)
    md[b"pandas"] = payload
    pq.write_table(table.replace_schema_metadata(md), path)
    Trace.load(path)  # extra columns are ignored; nothing is unpickled
    assert not marker.exists()


@pytest.mark.parametrize("make, key, value", [
    (lambda: small_trace(), b"stratacl.communicators", b"{not json"),
    (lambda: moe_trace(), b"stratacl.moe", b'{"top_k": 8}'),  # a MoeShape missing fields
])
def test_corrupt_metadata_fails_clearly(tmp_path, make, key, value) -> None:  # noqa: ANN001
    path = make().save(tmp_path / "t.parquet")
    table = pq.read_table(path)
    md = dict(table.schema.metadata)
    md[key] = value
    pq.write_table(table.replace_schema_metadata(md), path)
    with pytest.raises(TraceError, match="corrupt metadata"):
        Trace.load(path)


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.ops[1].__setattr__("comm", "xp"), r"op 1 .*communicator 'xp' is not defined"),
    (lambda t: t.ops[0].__setattr__("ranks", (0, 9)), r"op 0 'attn'.*rank 9 outside 0..7"),
    (lambda t: t.ops[0].__setattr__("deps", (2,)), r"op \d .*dependency cycle"),
    (lambda t: t.ops[1].__setattr__("coll", "allsum"), r"op 1 .*unknown collective 'allsum'"),
    (lambda t: t.ops[2].__setattr__("peer_bytes", (1.0, 2.0)), r"op 2 .*4x4 matrix"),
    (lambda t: t.ops[0].__setattr__("flops", (1.0, 2.0)), r"op 0 'attn'.*flops has 2 values for 8 ranks"),
    (lambda t: t.ops[3].__setattr__("dst", (0,)), r"op 3 .*(sends to itself|union of src and dst)"),
    (lambda t: t.ops[4].__setattr__("nbytes", (-1.0,)), r"op 4 .*nbytes must be finite and ≥ 0"),
    (lambda t: t.ops[4].__setattr__("nbytes", (float("nan"),)), r"op 4 .*nbytes must be finite and ≥ 0"),
    (lambda t: t.ops[4].__setattr__("nbytes", (float("inf"),)), r"op 4 .*nbytes must be finite and ≥ 0"),
    (lambda t: t.ops[0].__setattr__("hbm_bytes", (1.0,) * 7 + (float("nan"),)), r"op 0 .*hbm_bytes must be finite"),
    (lambda t: t.ops[0].__setattr__("hbm_bytes", (1.0,) * 7 + (-2.0,)), r"op 0 .*hbm_bytes must be finite"),
    (lambda t: t.ops[1].__setattr__("ranks", (0, 1, 2, 3, 4)), r"op 1 .*not exactly covered"),
])
def test_validation_names_the_bad_op(mutate, message) -> None:  # noqa: ANN001
    tr = small_trace()
    mutate(tr)
    tr._preds = None
    with pytest.raises(TraceError, match=message):
        tr.validate()


def test_invalid_trace_file_is_rejected_on_load(tmp_path) -> None:  # noqa: ANN001
    tr = small_trace()
    tr.ops[1].comm = "nope"
    path = tr.save(tmp_path / "bad.parquet")
    with pytest.raises(TraceError, match="op 1"):
        Trace.load(path)


def test_long_vectors_are_stored_once_per_trace(tmp_path) -> None:  # noqa: ANN001
    """A layer's routing tables ride on every micro-batch's dispatch: the trace keeps one copy (built
    or loaded), equal in value to what was passed, while short vectors stay per op."""
    import numpy as np

    n = 16
    tr = Trace(world_size=n)
    tr.add_family("ep", [range(n)])
    table = np.arange(n * n, dtype=float)
    ids = [tr.collective("alltoallv", "ep", 1e6, stream="s", peer_bytes=table) for _ in range(3)]
    ids.append(tr.collective("alltoallv", "ep", 1e6, stream="s", peer_bytes=table + 1))
    vecs = [tr.ops[i].peer_bytes for i in ids]
    assert vecs[0] is vecs[1] is vecs[2] and vecs[3] is not vecs[0]
    assert vecs[0] == tuple(table.tolist()) and hash(vecs[0]) == hash(tuple(table.tolist()))
    tr.save(tmp_path / "t.parquet")
    back = Trace.load(tmp_path / "t.parquet")
    assert back.ops[0].peer_bytes is back.ops[2].peer_bytes and back.ops == tr.ops


# --------------------------------------------------------------------------- the MoE shape

SHAPE = MoeShape(dispatch_bytes_per_copy=7168.0 + 224.0, combine_bytes_per_copy=14336.0, experts_per_rank=8,
                 top_k=8)


def moe_trace(moe: MoeShape | None = SHAPE) -> Trace:
    tr = Trace(world_size=4, meta={"workload": "test"}, moe=moe)
    tr.add_family("ep", [range(4)])
    peer = [[0, 3, 1, 2]] * 4
    d = tr.collective("dispatch", "ep", 6.0 * SHAPE.dispatch_bytes_per_copy, peer_bytes=peer, moe_mode="ll",
                      name="L0.dispatch")
    tr.collective("combine", "ep", 6.0 * SHAPE.combine_bytes_per_copy, peer_bytes=peer, moe_mode="ll", deps=[d])
    return tr


def test_moe_shape_round_trips(tmp_path) -> None:  # noqa: ANN001
    tr = moe_trace()
    tr.validate()
    loaded = Trace.load(tr.save(tmp_path / "t.parquet"))
    assert loaded.moe == SHAPE and loaded.ops == tr.ops and loaded.meta == tr.meta
    assert loaded.moe.bytes_per_copy("combine") == 14336.0
    assert Trace.load(small_trace().save(tmp_path / "plain.parquet")).moe is None


def test_a_file_with_the_older_meta_moe_dict_loads_its_shape(tmp_path) -> None:  # noqa: ANN001
    path = moe_trace().save(tmp_path / "t.parquet")
    table = pq.read_table(path)
    md = dict(table.schema.metadata)
    del md[b"stratacl.moe"]
    md[b"stratacl.meta"] = json.dumps({"workload": "test", "moe": {
        "bytes_per_copy": {"dispatch": 7392.0, "combine": 14336.0}, "experts_per_rank": 8, "top_k": 8}}).encode()
    pq.write_table(table.replace_schema_metadata(md), path)
    loaded = Trace.load(path)
    assert loaded.moe == SHAPE and loaded.meta == {"workload": "test"}


def test_a_dispatch_without_a_moe_shape_is_refused_naming_the_op(tmp_path) -> None:  # noqa: ANN001
    tr = moe_trace(None)
    with pytest.raises(TraceError, match=r"op 0 'L0.dispatch'.*dispatch needs the trace's MoeShape"):
        tr.validate()
    path = tr.save(tmp_path / "bare.parquet")
    with pytest.raises(TraceError, match="needs the trace's MoeShape"):
        Trace.load(path)


@pytest.mark.parametrize("shape, message", [
    (dataclasses.replace(SHAPE, experts_per_rank=0), "experts_per_rank must be an integer ≥ 1"),
    (dataclasses.replace(SHAPE, top_k=0), "top_k must be an integer ≥ 1"),
    (dataclasses.replace(SHAPE, combine_bytes_per_copy=float("nan")), "combine_bytes_per_copy must be"),
    (dataclasses.replace(SHAPE, dispatch_bytes_per_copy=-1.0), "dispatch_bytes_per_copy must be"),
])
def test_a_bad_moe_shape_is_refused(shape, message) -> None:  # noqa: ANN001
    with pytest.raises(TraceError, match=f"MoeShape: {message}"):
        moe_trace(shape).validate()
