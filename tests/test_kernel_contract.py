"""The Op contract of issue 21: `Op.kernel` (a KernelClass) and `Op.gemms` ((m, n, k, count) per
matmul) round-trip through parquet, older traces load with the defaults, bad values name the op."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from stratacl.errors import TraceError
from stratacl.trace import Trace
from stratacl.vocab import KernelClass


def kernel_trace() -> Trace:
    t = Trace(world_size=2)
    t.compute([0, 1], flops=2 * 4096 * 7168 * 2048 * 3, hbm_bytes=1e8, kernel=KernelClass.grouped_gemm,
              gemms=[(4096, 7168, 2048, 3), (128, 7168, 2048, 1)], name="experts")
    t.compute([0, 1], flops=1e9, hbm_bytes=1e6, core="vector", kernel="elementwise", name="rmsnorm")
    t.compute([0, 1], flops=1e9, name="generic")
    t.validate()
    return t


def test_parquet_round_trip_keeps_kernel_and_gemms(tmp_path) -> None:  # noqa: ANN001
    t = kernel_trace()
    back = Trace.load(t.save(tmp_path / "t.parquet"))
    assert back.ops == t.ops
    assert [(o.kernel, o.gemms) for o in back.ops] == [
        ("grouped_gemm", ((4096, 7168, 2048, 3), (128, 7168, 2048, 1))), ("elementwise", ()), ("", ())]
    assert all(type(x) is int for x in back.ops[0].gemms[1])


def test_older_trace_without_the_columns_loads_with_defaults(tmp_path) -> None:  # noqa: ANN001
    path = kernel_trace().save(tmp_path / "t.parquet")
    table = pq.read_table(path)
    old = table.drop(["kernel", "gemms"])
    pq.write_table(old.replace_schema_metadata(table.schema.metadata), path)
    back = Trace.load(path)
    assert [(o.kernel, o.gemms) for o in back.ops] == [("", ())] * 3
    assert back.ops[0].flops == kernel_trace().ops[0].flops


@pytest.mark.parametrize("mutate, message", [
    (lambda o: setattr(o, "kernel", "matmul"), r"op 0 'experts'.*kernel 'matmul' unknown"),
    (lambda o: setattr(o, "gemms", ((4096, 7168, 2048),)), r"op 0 'experts'.*\(m, n, k, count\)"),
    (lambda o: setattr(o, "gemms", ((4096, 0, 2048, 1),)), r"op 0 'experts'.*positive integers"),
    (lambda o: setattr(o, "gemms", ((4096, 7168, 2048, -2),)), r"op 0 'experts'.*positive integers"),
    (lambda o: setattr(o, "gemms", ((4096.5, 7168, 2048, 1),)), r"op 0 'experts'.*positive integers"),
])
def test_bad_kernel_fields_name_the_op(mutate, message) -> None:  # noqa: ANN001
    t = kernel_trace()
    mutate(t.ops[0])
    with pytest.raises(TraceError, match=message):
        t.validate()


def test_kernel_fields_only_on_compute_ops() -> None:
    t = Trace(world_size=2)
    t.add_communicator("w", [0, 1])
    t.collective("allreduce", "w", 1e6, kernel="gemm", name="ar")
    with pytest.raises(TraceError, match="op 0 'ar'.*compute kernels only"):
        t.validate()


def test_bad_gemms_in_a_file_are_rejected_on_load(tmp_path) -> None:  # noqa: ANN001
    t = kernel_trace()
    t.ops[0].gemms = ((1, 2, 3, 0),)
    with pytest.raises(TraceError, match="op 0 'experts'"):
        Trace.load(t.save(tmp_path / "bad.parquet"))
