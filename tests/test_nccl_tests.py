"""nccl-tests results as network tiers (importers/nccl_tests.py, calibrate/comm_points.py
``merge_points``, `simumax import nccl-tests`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from simumax.calibrate.comm_points import CommPoint, merge_points
from simumax.config.loader import load_strategy, load_system
from simumax.cost.network import NetworkModel
from simumax.errors import ConfigError
from simumax.graph.kernels import Collective
from simumax.importers.nccl_tests import parse_nccl_tests, system_from_nccl_tests
from tests.conftest import run_cli

SIZES = [2**k for k in range(16, 31, 2)]  # 64 KiB .. 1 GiB
TEST_OF = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
           "all2all": "alltoall", "p2p": "sendrecv"}


def _model_time(system, op: str, nbytes: float, ranks: int) -> float:
    """The cost model's time of one collective over ``ranks`` consecutive ranks (8 per node)."""
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"world_size": max(ranks, 2), "tp_size": max(ranks, 2)})
    net = NetworkModel(system, st)
    if op == "p2p":  # the pipeline's pair: across nodes when the stages are a node apart
        st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"world_size": 16, "tp_size": 8, "pp_size": 2}) if ranks > 8 \
            else load_strategy("tp1_pp1_dp8_mbs1").with_updates({"world_size": 2, "pp_size": 2})
        return NetworkModel(system, st).time(Collective("p2p", nbytes, "pp"))
    return net.time(Collective(op, nbytes, "tp"))


def nccl_tests_output(test: str, ranks: int, rows: list[tuple[int, float]], *, old: bool = False, per_node: int = 8,
                      starting: bool = True) -> str:
    """nccl-tests' output as rank 0 prints it (2.13 layout; ``old``: without redop / root)."""
    head = [f"# nThread 1 nGpus 1 minBytes {rows[0][0]} maxBytes {rows[-1][0]} step: 4(factor) warmup iters: 5 iters: 20 "
            "agg iters: 1 validation: 1 graph: 0", "#"]
    if starting:
        head.append(f"# Collective test starting: {test}_perf")
    head += ["# Using devices"]
    head += [f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on {'node%02d' % (r // per_node):>10} device {r % per_node:2d} "
             f"[0x{r:02x}] NVIDIA H100 80GB HBM3" for r in range(ranks)]
    cols = "size count type time algbw busbw #wrong time algbw busbw #wrong" if old else \
        "size count type redop root time algbw busbw #wrong time algbw busbw #wrong"
    head += ["#", f"#  {cols}"]
    body = []
    for size, seconds in rows:
        us = seconds * 1e6
        algbw = size / seconds / 1e9
        mid = "" if old else "   sum      -1"
        body.append(f"{size:12d} {size // 2:12d}   bfloat16{mid} {us:8.2f} {algbw:7.2f} {algbw:7.2f}      0 "
                    f"{us * 1.01:8.2f} {algbw:7.2f} {algbw:7.2f}      0")
    return "\n".join(head + body + ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 12.3", "#", ""])


def _truth():
    """A cluster unlike the preset: slower NVLink collectives, slower and laggier NICs."""
    d = load_system("h100-sxm-80gb").to_dict()
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all2all", "p2p"):
        d["networks"]["high_intra_node"]["op"][op]["efficient_factor"] = 0.48 if op == "all2all" else 0.62
        d["networks"]["inter_node"]["op"][op]["efficient_factor"] = 0.41 if op == "all2all" else 0.55
        d["networks"]["inter_node"]["op"][op]["latency_us"] = 12.0
    return load_system(d)


def test_parses_both_layouts_and_finds_the_op() -> None:
    rows = [(1 << 20, 40e-6), (1 << 26, 900e-6)]
    for old, starting in ((False, True), (True, False)):
        text = nccl_tests_output("all_gather", 16, rows, old=old, starting=starting)
        path = Path("/tmp") / f"simumax_test_{'old' if old else 'new'}_all_gather_perf.txt"
        path.write_text(text)
        run = parse_nccl_tests(path)
        assert (run.op, run.ranks, run.hosts) == ("all_gather", 16, 2)
        assert [(p.nbytes, p.seconds, p.group_size, p.nodes) for p in run.points] == [
            (1 << 20, pytest.approx(40e-6), 16, 2), (1 << 26, pytest.approx(900e-6), 16, 2)]


def test_launcher_prefixes_are_read_past(tmp_path: Path) -> None:
    """srun -l ("0: ") and Open MPI --tag-output ("[1,0]<stdout>:") put a prefix on every line."""
    text = nccl_tests_output("all_reduce", 16, [(1 << 20, 40e-6), (1 << 26, 900e-6)])
    for prefix in ("0: ", "[1,0]<stdout>:"):
        f = tmp_path / "all_reduce.txt"
        f.write_text("\n".join(prefix + line for line in text.splitlines()))
        run = parse_nccl_tests(f)
        assert (run.ranks, run.hosts, len(run.points)) == (16, 2, 2)


def test_what_it_cannot_read_is_one_config_error(tmp_path: Path) -> None:
    rows = [(1 << 20, 40e-6)]
    f = tmp_path / "results.txt"
    f.write_text(nccl_tests_output("all_reduce", 8, rows, starting=False))
    with pytest.raises(ConfigError, match="--op"):
        parse_nccl_tests(f)
    assert parse_nccl_tests(f, "all_reduce_perf").op == "all_reduce"
    f.write_text(nccl_tests_output("broadcast", 8, rows))
    with pytest.raises(ConfigError, match="broadcast"):
        parse_nccl_tests(f)
    f.write_text("\n".join(line for line in nccl_tests_output("all_reduce", 8, rows).splitlines() if "Rank" not in line))
    with pytest.raises(ConfigError, match="Rank"):
        parse_nccl_tests(f)
    f.write_text(nccl_tests_output("all_reduce", 8, rows) + nccl_tests_output("all_gather", 8, rows))
    with pytest.raises(ConfigError, match="several tests"):
        parse_nccl_tests(f)
    f.write_text("# nothing\n")
    with pytest.raises(ConfigError):
        parse_nccl_tests(f, "all_reduce")


def test_fitted_tiers_reproduce_the_measurements(tmp_path: Path) -> None:
    """Times made by the cost model on one cluster, read as nccl-tests results onto another
    cluster's preset: the fitted system gives every measured time back — one node (the
    node's tier), two and four nodes (inter_node through the model's split of a group into
    its node-local and cross-node parts), p2p and all-to-all across nodes."""
    truth, base = _truth(), load_system("h100-sxm-80gb")
    runs = []
    for op, ranks in (("all_reduce", 8), ("all_gather", 8), ("reduce_scatter", 8), ("all2all", 8), ("p2p", 2),
                      ("all_reduce", 16), ("all_reduce", 32), ("all_gather", 16), ("reduce_scatter", 32), ("p2p", 16),
                      ("all2all", 16), ("all2all", 64)):
        rows = [(s, _model_time(truth, op, s, ranks)) for s in SIZES]
        f = tmp_path / f"{op}_{ranks}.txt"
        f.write_text(nccl_tests_output(TEST_OF[op], ranks, rows))
        runs.append((parse_nccl_tests(f), op, ranks))
    system, report = system_from_nccl_tests([r for r, _, _ in runs], base.to_dict())
    assert report["tiers"] == {"high_intra_node": 5 * len(SIZES), "inter_node": 7 * len(SIZES)} and not report["not_fitted"]
    fitted = load_system(system)
    for run, op, ranks in runs:
        for p in run.points:
            assert _model_time(fitted, op, p.nbytes, ranks) == pytest.approx(p.seconds, rel=0.02), (op, ranks, p.nbytes)
    # on the preset as it was, the same jobs' collectives are off
    assert _model_time(base, "all_reduce", 2**30, 16) < 0.85 * _model_time(truth, "all_reduce", 2**30, 16)


def test_an_unmeasured_node_local_part_is_said() -> None:
    pts = [CommPoint("all_reduce", 16, s, 1e-3 + s / 40e9, nodes=2) for s in SIZES]
    _, where = merge_points(load_system("h100-sxm-80gb").to_dict(), pts)
    assert where["tiers"] == {"inter_node": len(SIZES)}
    assert [n.split(" (")[0] for n in where["notes"]] == ["the node's all_gather", "the node's reduce_scatter"]


def test_cross_node_all_to_all_fits_the_nics_all_to_all_line() -> None:
    """An all-to-all over 2 nodes of 8: the model's time is the longer of the NICs' part (an
    all-to-all of the buffer over the 2 nodes, half of it crossing, at the tier's all-to-all
    line) and the 7/16 local share over NVLink (an all-to-all of the 8 local ranks' half); the
    fit is that line, the local share the node's all-to-all (said when not measured on one
    node), and a point the node's tier alone outlasts is not fitted."""
    gbps = load_system("h100-sxm-80gb").networks.tiers["inter_node"].bandwidth.gbps
    # 0.35 of the NIC rate (the preset says 0.70), 30 us per call
    pts = [CommPoint("all2all", 16, s, 30e-6 + s / 2 / (gbps * 1e9 * 0.35), nodes=2) for s in SIZES]
    system, where = merge_points(load_system("h100-sxm-80gb").to_dict(), pts)
    assert where["tiers"] == {"inter_node": len(SIZES)} and not where["not_fitted"]
    assert [n.split(" (")[0] for n in where["notes"]] == ["the node's all2all"]
    spec = load_system(system).networks.tiers["inter_node"].op["all2all"]
    assert spec.efficient_factor == pytest.approx(0.35, rel=1e-6)
    for p in pts:
        assert _model_time(load_system(system), "all2all", p.nbytes, 16) == pytest.approx(p.seconds, rel=1e-6)
    # faster than the node's own share of it could go: nothing left for the NICs
    quick = [CommPoint("all2all", 16, 2**30, 1e-4, nodes=2)]
    system, where = merge_points(load_system("h100-sxm-80gb").to_dict(), quick)
    assert where["tiers"] == {} and "nothing left for the NICs" in where["not_fitted"][0]


def test_leaf_switches_the_base_states_are_divided_out() -> None:
    """On a base that states 4:1 top-of-rack leaves of 3 nodes, a group over 8 nodes runs
    its NIC part at the leaf rate (cost/fabric.py: a ring 3/4 of the NICs' rate, an
    all-to-all 7/20): the fit divides that out, so the fitted tier's efficiencies are the
    NICs' own and the model, which applies the leaf rate again, gives the times back."""
    leaf = {"leaf_radix": 32, "leaf_oversubscription": 4.0, "rail_optimized": False}
    truth = _truth().with_updates(leaf)
    base = load_system("h100-sxm-80gb").with_updates(leaf)
    local = [CommPoint(o, 8, s, _model_time(truth, o, s, 8)) for o in ("reduce_scatter", "all_gather", "all2all")
             for s in SIZES]
    across = [CommPoint(o, 64, s, _model_time(truth, o, s, 64), nodes=8) for o in ("all_reduce", "all2all")
              for s in SIZES]
    system, where = merge_points(base.to_dict(), local + across)
    assert where["tiers"] == {"high_intra_node": 3 * len(SIZES), "inter_node": 2 * len(SIZES)}
    fitted = load_system(system)
    for p in local + across:
        assert _model_time(fitted, p.op, p.nbytes, p.group_size) == pytest.approx(p.seconds, rel=0.02), (p.op, p.nbytes)
    nic = fitted.networks.tiers["inter_node"].op
    assert nic["all_reduce"].efficient_factor == pytest.approx(0.55, rel=0.02)  # the truth's NICs, not x 3/4
    assert nic["all2all"].efficient_factor == pytest.approx(0.41, rel=0.02)


def test_cli_writes_a_system_perf_reads(tmp_path: Path) -> None:
    truth = _truth()
    files = []
    for op, ranks in (("all_reduce", 8), ("all_reduce", 16)):
        f = tmp_path / f"{TEST_OF[op]}_{ranks}gpus.log"
        f.write_text(nccl_tests_output(TEST_OF[op], ranks, [(s, _model_time(truth, op, s, ranks)) for s in SIZES],
                                       starting=False))
        files.append(str(f))
    out = tmp_path / "cluster.json"
    r = run_cli("import", "nccl-tests", *files, "--base", "h100-sxm-80gb", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "high_intra_node" in r.stdout and "inter_node" in r.stdout
    report = json.loads((tmp_path / "cluster.comm_report.json").read_text())
    assert [f["hosts"] for f in report["files"]] == [1, 2]
    p = run_cli("perf", "-m", "llama3-8b", "-s", "tp8_pp1_dp1_mbs1", "-y", str(out), "--world-size", "16", "--json")
    assert p.returncode == 0, p.stderr
    bad = run_cli("import", "nccl-tests", str(tmp_path / "none.log"), "--base", "h100-sxm-80gb", "--out", str(out))
    assert bad.returncode == 2 and bad.stderr.startswith("error:")


@settings(max_examples=15, deadline=None)
@given(intra=hs.floats(0.3, 1.2), inter=hs.floats(0.2, 1.5), lat=hs.floats(0.0, 40.0),
       ranks=hs.sampled_from([16, 32, 64]), op=hs.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "all2all"]))
def test_any_cluster_comes_back_from_its_own_times(intra: float, inter: float, lat: float, ranks: int, op: str) -> None:
    """Whatever a cluster's link efficiencies and NIC latency, its one-node and multi-node
    times fitted onto the preset give those times back (the fit inverts the model's split)."""
    d = load_system("h100-sxm-80gb").to_dict()
    for o in ("all_reduce", "all_gather", "reduce_scatter", "all2all"):
        d["networks"]["high_intra_node"]["op"][o]["efficient_factor"] = intra
        d["networks"]["inter_node"]["op"][o]["efficient_factor"] = inter
        d["networks"]["inter_node"]["op"][o]["latency_us"] = lat
    truth = load_system(d)
    # one node: the op and the parts the model splits it into across nodes (as a user runs every test)
    local = [CommPoint(o, 8, s, _model_time(truth, o, s, 8)) for o in {op, "reduce_scatter", "all_gather"} for s in SIZES]
    pts = [CommPoint(op, ranks, s, _model_time(truth, op, s, ranks), nodes=ranks // 8) for s in SIZES]
    system, where = merge_points(load_system("h100-sxm-80gb").to_dict(), local + pts)
    assert not where["notes"] and not where["not_fitted"]
    fitted = load_system(system)
    for p in local + pts:
        assert _model_time(fitted, p.op, p.nbytes, p.group_size) == pytest.approx(p.seconds, rel=0.02)
