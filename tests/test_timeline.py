"""Chrome-trace timelines (lanes, nested phases, flow arrows, budget) and the opt-in utilisation
recorder (bounds, closed forms, no effect on the replay)."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from helpers import compose_run, make_library

from stratacl.config import ExpansionMode, Mover
from stratacl.engine.replay import SimResult, simulate
from stratacl.engine.utilisation import integral
from stratacl.machine.fabric import RESOURCES, Fabric
from stratacl.report.timeline import ENGINE_TID, RANK_PID, chrome_trace, write_timeline
from stratacl.trace import Trace

EPS = 1e-9


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    return Fabric(compose_run([]).fabric)


def overlap_trace(layers: int = 3) -> Trace:
    """Compute on one stream overlapping two comm streams of collectives on two TP groups, + a p2p."""
    tr = Trace(world_size=8)
    tr.add_family("tp", [range(0, 4), range(4, 8)])
    for layer in range(layers):
        tr.compute(range(8), flops=2e11, hbm_bytes=1e8, stream="compute", name=f"mm{layer}")
        tr.collective("allgather", "tp", 8e6, stream="comm", name=f"ag{layer}", buffer="x")
        tr.collective("allreduce", "tp", 8e6, stream="comm2", name=f"ar{layer}", buffer="y")
    tr.add("p2p", [0, 4], src=[0], dst=[4], nbytes=1e6, name="send", stream="comm")
    return tr


@pytest.fixture(scope="module")
def replays(fabric) -> dict[str, tuple[Trace, SimResult]]:  # noqa: ANN001
    tr = overlap_trace()
    # hccl in AIV mode: one library that moves data with vector cores, one with SDMA
    libs = {"hccl": make_library(fabric, "hccl", expansion_mode=ExpansionMode.aiv),
            "stratacl": make_library(fabric, "stratacl")}
    return {lib: (tr, simulate(tr, model, utilisation=True)) for lib, model in libs.items()}


# --------------------------------------------------------------------------- timeline


def _by(events: list[dict], ph: str, cat: str | None = None) -> list[dict]:
    """Events of one phase type (and category); the "timeline of" slice only when asked for."""
    return [e for e in events if e["ph"] == ph and (e.get("cat") == cat if cat else e.get("cat") != "about")]


def test_timeline_is_valid_json_with_ops_on_every_rank(tmp_path, replays) -> None:  # noqa: ANN001
    path = tmp_path / "timeline.json"
    write_timeline(path, replays, max_ranks=32)
    events = json.loads(path.read_text())["traceEvents"]
    trace, _ = replays["hccl"]
    for li in range(2):
        pids = {e["pid"] for e in _by(events, "X", "collective") if e["pid"] // RANK_PID == li}
        assert pids == {li * RANK_PID + r for r in range(8)}
    # one op slice per (op, rank, library), on the lane of the op's stream
    ops = [e for e in _by(events, "X") if e["cat"] in ("compute", "collective", "p2p")]
    assert len(ops) == 2 * sum(len(op.ranks) for op in trace.ops)
    lanes = {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
             and e["pid"] == 0}
    assert {"stream compute", "stream comm", "stream comm2"} <= set(lanes)
    assert "comm cores (vector)" in lanes and "SDMA engines" not in lanes  # hccl moves data with vector cores
    stratacl_lanes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
                      and e["pid"] == RANK_PID}
    assert "SDMA engines" in stratacl_lanes  # stratacl offloads to SDMA
    # compute and communication overlap in time on rank 0 (what the timeline is for)
    r0 = [e for e in ops if e["pid"] == 0]
    comp = [(e["ts"], e["ts"] + e["dur"]) for e in r0 if e["cat"] == "compute"]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in r0 if e["cat"] == "collective"]
    assert any(a0 < b1 and b0 < a1 for a0, a1 in comp for b0, b1 in comm)


def test_flow_events_pair_ranks_of_one_collective(replays) -> None:  # noqa: ANN001
    events = chrome_trace(replays, max_ranks=32)["traceEvents"]
    slices = {(e["pid"], e["tid"], e["args"]["op"]): e for e in _by(events, "X") if "op" in e.get("args", {})
              and e["cat"] in ("collective", "p2p")}
    starts = {e["id"]: e for e in _by(events, "s")}
    finishes = {e["id"]: e for e in _by(events, "f")}
    assert starts and set(starts) == set(finishes)
    trace, _ = replays["hccl"]
    linked: dict[tuple[int, int], set[int]] = defaultdict(set)  # (library, op) -> ranks linked
    for fid, s in starts.items():
        f = finishes[fid]
        assert f["bp"] == "e" and s["pid"] != f["pid"] and s["pid"] // RANK_PID == f["pid"] // RANK_PID
        # both ends lie inside a slice of the same op on their rank
        owners = []
        for end in (s, f):
            hit = [k for k, sl in slices.items() if k[0] == end["pid"] and k[1] == end["tid"]
                   and sl["ts"] <= end["ts"] <= sl["ts"] + sl["dur"]]
            assert len(hit) == 1, end
            owners.append(hit[0][2])
        assert owners[0] == owners[1]
        li = s["pid"] // RANK_PID
        linked[(li, owners[0])] |= {s["pid"] % RANK_PID, f["pid"] % RANK_PID}
    for op in trace.ops:
        if op.kind in ("collective", "p2p"):
            for li in range(2):
                assert linked[(li, op.id)] == set(op.ranks)  # the chain reaches every member
    p2p = next(op for op in trace.ops if op.kind == "p2p")
    (fid,) = [i for i, s in starts.items() if s["name"] == "p2p" and s["pid"] < RANK_PID]
    assert (starts[fid]["pid"], finishes[fid]["pid"]) == (p2p.src[0], p2p.dst[0])  # sender -> receiver


def test_phases_nest_inside_their_op_and_engine_lanes_never_overlap(replays) -> None:  # noqa: ANN001
    events = chrome_trace(replays, max_ranks=32)["traceEvents"]
    ops = {(e["pid"], e["tid"], e["args"]["op"]): e for e in _by(events, "X") if e["cat"] != "phase"
           and e["tid"] < min(ENGINE_TID.values())}
    phases = _by(events, "X", "phase")
    assert {p["name"] for p in phases} >= {"copy", "wire", "sync", "launch"}
    for p in phases:
        parent = ops[(p["pid"], p["tid"], p["args"]["op"])]
        assert parent["ts"] <= p["ts"] and p["ts"] + p["dur"] <= parent["ts"] + parent["dur"] + 1e-9
    lanes = defaultdict(list)
    for e in _by(events, "X"):
        if e["tid"] >= min(ENGINE_TID.values()):
            lanes[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    assert lanes
    for spans in lanes.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:], strict=False))
    counters = _by(events, "C")
    assert {c["name"] for c in counters} >= {"ports utilisation", "hbm utilisation"}
    assert all(0 <= v <= 1 + EPS for c in counters for v in c["args"].values())


def test_event_budget_keeps_op_slices_first(replays) -> None:  # noqa: ANN001
    full = chrome_trace(replays, max_ranks=32)
    n_ops = len([e for e in full["traceEvents"] if e["ph"] == "X" and e["cat"] in ("compute", "collective", "p2p")])
    small = chrome_trace(replays, max_ranks=32, max_events=n_ops + 10)
    counted = [e for e in small["traceEvents"] if e["ph"] != "M"]
    assert len(counted) <= n_ops + 10
    assert len([e for e in counted if e["ph"] == "X" and e["cat"] in ("compute", "collective", "p2p")]) == n_ops
    assert small["otherData"]["dropped_events"] > 0 and "dropped_events" not in full["otherData"]
    few = chrome_trace(replays, max_ranks=2)
    assert len({e["pid"] for e in _by(few["traceEvents"], "X")}) == 4  # 2 ranks × 2 libraries


def test_the_file_says_what_it_shows(replays) -> None:  # noqa: ANN001
    """timeline.json is one replayed trace per library, not a whole run: the label (the workload's,
    or one naming the trace) is in otherData and is the first process's name and only slice."""
    said = chrome_trace(replays, max_ranks=32, label="one decode iteration, not the run")
    assert said["otherData"]["timeline_of"] == "one decode iteration, not the run"
    (about,) = _by(said["traceEvents"], "X", "about")
    assert about["name"] == "one decode iteration, not the run" and about["ts"] == 0
    names = [e for e in said["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert names[0]["args"]["name"] == "timeline of: one decode iteration, not the run"
    sorts = {e["pid"]: e["args"]["sort_index"] for e in said["traceEvents"] if e["name"] == "process_sort_index"}
    assert sorts[about["pid"]] == min(sorts.values())
    trace, res = next(iter(replays.values()))
    assert about["dur"] == pytest.approx(max(r.makespan_s for _, r in replays.values()) * 1e6, abs=1e-3)
    info = said["otherData"]["traces"]
    assert set(info) == set(replays) and info[next(iter(replays))]["ops"] == len(trace.ops)
    generic = chrome_trace(replays, max_ranks=32)["otherData"]["timeline_of"]
    assert f"{len(trace.ops)} ops on {trace.world_size} ranks" in generic


def test_timeline_without_recorded_phases_keeps_the_split_in_args(fabric) -> None:  # noqa: ANN001
    tr = overlap_trace(1)
    res = simulate(tr, make_library(fabric, "hccl"))
    assert res.utilisation is None and res.phases is None
    events = chrome_trace({"hccl": (tr, res)}, max_ranks=32)["traceEvents"]
    assert not _by(events, "X", "phase") and not _by(events, "C")
    ag = next(e for e in _by(events, "X", "collective") if e["name"] == "ag0")
    assert ag["args"]["wire_us"] > 0 and ag["args"]["copy_us"] > 0
    assert _by(events, "s")  # flows need no recorder


# --------------------------------------------------------------------------- utilisation


def test_recording_does_not_change_the_replay(fabric, replays) -> None:  # noqa: ANN001
    trace, rec = replays["hccl"]
    plain = simulate(trace, make_library(fabric, "hccl", expansion_mode=ExpansionMode.aiv))
    np.testing.assert_array_equal(plain.start, rec.start)
    np.testing.assert_array_equal(plain.end, rec.end)
    # the recorded phases account for every op's time split
    per_op = rec.phases.assign(d=rec.phases["end_s"] - rec.phases["start_s"]).groupby(["op", "category"])["d"].sum()
    for (op, cat), d in per_op.items():
        assert d == pytest.approx(rec.split[cat][op], abs=1e-15)


def test_utilisation_is_bounded_and_tidy(replays) -> None:  # noqa: ANN001
    for _, res in replays.values():
        u = res.utilisation
        assert list(u.columns) == ["time_s", "resource", "utilisation"]
        assert set(u["resource"].astype(str)) == set(RESOURCES)
        assert u["utilisation"].between(-EPS, 1 + EPS).all()
        assert u["time_s"].min() == 0.0 and u["time_s"].max() == pytest.approx(res.makespan_s)
        last = u.sort_values("time_s").groupby("resource", observed=True)["utilisation"].last()
        assert (last.abs() < 1e-9).all()  # everything idle after the makespan
        assert u.groupby("resource", observed=True)["utilisation"].max()[["ub_tx", "hbm"]].gt(0.05).all()


def _value_at(u, resource: str, t: float) -> float:  # noqa: ANN001
    sub = u[(u["resource"] == resource) & (u["time_s"] <= t)].sort_values("time_s")
    return float(sub["utilisation"].iloc[-1]) if len(sub) else 0.0


@pytest.mark.parametrize("lib", ["hccl", "stratacl"])
def test_single_transfer_closed_form(fabric, lib: str) -> None:  # noqa: ANN001
    """One p2p of B bytes between two dies of different NPUs: ∫ port utilisation × dies × β = B on
    both the sender's tx and the receiver's rx port; HBM integrates to the op's HBM bytes."""
    model = make_library(fabric, lib)
    nbytes = 64e6
    tr = Trace(world_size=4)
    tr.add("p2p", [0, 2], src=[0], dst=[2], nbytes=nbytes)
    res = simulate(tr, model, utilisation=True)
    u = res.utilisation
    beta = fabric.tier(int(fabric.tier_index(0, 2)), model.cfg.plane).beta_Bps
    dies = 2  # averaged over the dies in use
    for port in ("ub_tx", "ub_rx"):
        assert integral(u, port) * dies * beta == pytest.approx(nbytes, rel=1e-9)
    assert integral(u, "hbm") * dies * fabric.hbm_Bps == pytest.approx(res.hbm_bytes.sum(), rel=1e-9)
    wire = res.phases[res.phases["category"] == "wire"].iloc[0]
    mid = (wire["start_s"] + wire["end_s"]) / 2
    assert _value_at(u, "ub_tx", mid) > 0 and _value_at(u, "ub_rx", mid) > 0
    assert _value_at(u, "ub_tx", wire["start_s"] - 1e-9) == 0.0  # nothing on the wire before it
    engine = "vec" if model.mover == Mover.vector_cores else "sdma"  # hccl: AI_CPU mode moves with SDMA
    assert _value_at(u, engine, mid) > 0


def test_held_cores_count_as_busy(fabric) -> None:  # noqa: ANN001
    """hccl's AIV-mode transfer holds comm_cores of the vector cores on every member die for the whole
    phase."""
    model = make_library(fabric, "hccl", expansion_mode=ExpansionMode.aiv)
    tr = Trace(world_size=4)
    tr.add_family("w", [range(4)])
    tr.collective("allgather", "w", 32e6, buffer="x")
    res = simulate(tr, model, utilisation=True)
    wire = res.phases[res.phases["category"] == "wire"].iloc[0]
    mid = (wire["start_s"] + wire["end_s"]) / 2
    assert model.cfg.comm_cores == 24 and fabric.vector_cores == 48  # conf/library/hccl.yaml, 910C die
    assert _value_at(res.utilisation, "vec", mid) == pytest.approx(0.5)  # 24 of the 48 vector cores
    assert _value_at(res.utilisation, "cube", mid) == 0.0 or fabric.cores_shared


def test_run_level_intervals_keep_every_interval_on_non_overlapping_lanes() -> None:
    """run_timeline.json (llm_infer: iterations per instance, requests): each interval is one
    slice of its (library, track) process, overlapping ones on separate lanes, NaN ends dropped."""
    import pandas as pd

    from stratacl.report.timeline import interval_timeline
    from workloads.llm_infer.workload import _run_intervals

    it = pd.DataFrame({"library": "hccl", "phase": ["prefill", "decode", "decode"], "instance": [0, 0, 0],
                       "start_s": [0.0, 1.0, 1.05], "time_s": [1.0, 0.05, 0.05], "batch_per_die": [1, 8, 8],
                       "tokens": [4096, 8, 8], "exposed_comm_s": [0.001, 0.002, 0.002]})
    req = pd.DataFrame({"library": "hccl", "request": [0, 1, 2], "arrival_s": [0.0, 0.2, 0.3],
                        "completion_s": [2.0, 1.5, float("nan")], "ttft_s": [1.0, 1.1, float("nan")],
                        "tpot_s": [0.02, 0.03, float("nan")]})
    out = interval_timeline(_run_intervals(it, req), "the whole run")
    assert out["otherData"]["timeline_of"] == "the whole run"
    xs = [e for e in out["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 3 + 2  # request 2 never completed
    procs = {e["pid"]: e["args"]["name"] for e in out["traceEvents"] if e["name"] == "process_name"}
    assert sorted(procs.values()) == ["hccl · decode instance 0", "hccl · prefill instance 0",
                                      "hccl · requests (arrival → completion)", "timeline of: the whole run"]
    lanes = defaultdict(list)
    for e in xs:
        lanes[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in lanes.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:], strict=False))
    reqs = [e for e in xs if e["name"].startswith("request")]
    assert {e["tid"] for e in reqs} == {0, 1}  # the two requests overlap
    assert reqs[0]["args"] == {"ttft_ms": 1000.0, "tpot_ms": 20.0}
    json.dumps(out, allow_nan=False)  # strict JSON


def test_serving_timeline_is_labelled_one_decode_iteration() -> None:
    """llm_infer's timeline.json holds one decode iteration of its most frequent batch: it says so."""
    from workloads.llm_infer.workload import _timeline_label

    tr = Trace(world_size=16, meta={"phase": "decode", "size": 64, "context": 8192})
    label = _timeline_label({"hccl": (tr, None)})
    assert label.startswith("ONE decode iteration, not the run")
    assert "64 per die, context 8192 tokens" in label and "16 dies" in label
