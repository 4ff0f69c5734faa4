"""Cluster networks as users describe them: NICs per node, Gb/s per NIC, NVLink domain."""

from __future__ import annotations

import pytest

from simumax import StrategyConfig
from simumax.config.loader import load_system
from simumax.cost.network import NetworkModel
from simumax.errors import ConfigError
from simumax.graph.kernels import Collective
from tests.conftest import run_cli


def test_inter_node_bandwidth_from_nic_count_by_hand() -> None:
    dgx_h100 = load_system("h100-sxm-80gb")
    assert (dgx_h100.nics_per_node, dgx_h100.nic_gbps) == (8, 400)  # 8 x NDR
    assert dgx_h100.networks.tiers["inter_node"].bandwidth.gbps == 8 * 400 / 8 / 8  # 50 GB/s per GPU
    dgx_a100 = load_system("a100-sxm-80gb")
    assert (dgx_a100.nics_per_node, dgx_a100.nic_gbps) == (8, 200)  # 8 x HDR
    assert dgx_a100.networks.tiers["inter_node"].bandwidth.gbps == 25.0
    four = dgx_h100.with_updates({"nics_per_node": 4})
    assert four.networks.tiers["inter_node"].bandwidth.gbps == 4 * 400 / 8 / 8  # 25 GB/s per GPU
    # the whole inter-node part of a DP all-reduce takes twice as long on half the NICs
    st = StrategyConfig(seq_len=4096, world_size=64, tp_size=8)
    c = Collective("all_reduce", 1e9, "dp")
    full, half = NetworkModel(dgx_h100, st), NetworkModel(four, st)
    assert half.time(c) > full.time(c)
    intra = NetworkModel(dgx_h100, StrategyConfig(seq_len=4096, world_size=8, tp_size=8))
    assert NetworkModel(four, StrategyConfig(seq_len=4096, world_size=8, tp_size=8)).time(
        Collective("all_gather", 1e8, "tp")) == intra.time(Collective("all_gather", 1e8, "tp"))  # NVLink untouched


def test_fabric_fields_need_each_other() -> None:
    with pytest.raises(ConfigError, match="nic_gbps"):
        load_system("a100_pcie").with_updates({"nics_per_node": 4})
    y = load_system("a100_pcie").with_updates({"nics_per_node": 4, "nic_gbps": 200})
    assert y.networks.tiers["inter_node"].bandwidth.gbps == 4 * 200 / 8 / 8
    with pytest.raises(ConfigError, match="nvlink_domain"):
        load_system("h100-sxm-80gb").with_updates({"nvlink_domain": 4})


def test_nvlink_domain_keeps_groups_on_the_scale_up_fabric() -> None:
    y = load_system("h100-sxm-80gb")
    st = StrategyConfig(seq_len=4096, world_size=32, tp_size=16)
    assert not NetworkModel(y, st).groups["tp"].intra_node
    rack = y.with_updates({"nvlink_domain": 32})
    assert NetworkModel(rack, st).groups["tp"].intra_node


def test_set_system_nics_per_node_on_the_cli() -> None:
    args = ["perf", "-m", "llama3-70b", "-s", "tp8_pp1_dp1_mbs1", "-y", "h100-sxm-80gb", "--set", "world_size=64", "--json"]
    import json

    base = json.loads(run_cli(*args).stdout)
    four = run_cli(*args, "--set", "system.nics_per_node=4")
    assert four.returncode == 0, four.stderr
    assert json.loads(four.stdout)["cost"]["duration_time_per_iter"] > base["cost"]["duration_time_per_iter"]
    bad = run_cli(*args, "--set", "system.nics_per_node=0")
    assert bad.returncode == 2 and "nics_per_node" in bad.stderr and "Traceback" not in bad.stderr


def test_presets_say_which_are_measured_and_which_derived() -> None:
    import json

    from simumax.config.hardware import preset_provenance

    assert preset_provenance("nvidia_h100_80gb_hbm3").startswith("measured")
    assert preset_provenance("a100_pcie").startswith("measured")
    assert "nvidia_h100_80gb_hbm3" in preset_provenance("h100-sxm-80gb") and preset_provenance("h100-sxm-80gb").startswith("derived")
    assert "default efficiency curves" in preset_provenance("b300-sxm-288gb")
    assert "b200_bf16_ceperm as that device's kernel times" in preset_provenance("gb200-nvl72")
    text = run_cli("presets", "system").stdout
    assert "a100-sxm-80gb" in text and "derived" in text and "measured" in text
    payload = json.loads(run_cli("presets", "system", "--json").stdout)
    assert set(payload["system_provenance"]) == set(payload["system"])


def test_leaf_switches_by_hand() -> None:
    """Rail-optimised or top-of-rack leaves and their oversubscription (cost/fabric.py)."""
    from simumax.cost.fabric import leaf_rate, nodes_per_leaf, uplink_share

    def leaf_rate_factor(y, *collective):  # the system's leaf figures, as NetworkModel reads them
        return leaf_rate(nodes_per_leaf(y), y.leaf_oversubscription, *collective)

    y = load_system("h100-sxm-80gb")
    assert nodes_per_leaf(y) is None and leaf_rate_factor(y, "all2all", 64, 1) == 1.0  # no leaf layer: unchanged
    rail = y.with_updates({"leaf_radix": 64})
    tor = rail.with_updates({"rail_optimized": False})
    assert nodes_per_leaf(rail) == 32 and nodes_per_leaf(tor) == 32 // 8  # 32 down-ports: NIC i of 32 nodes, or 4 nodes
    rail3 = rail.with_updates({"leaf_oversubscription": 3.0})
    assert nodes_per_leaf(rail3) == 48 and nodes_per_leaf(rail3.with_updates({"rail_optimized": False})) == 6  # 48 down, 16 up
    # shares of a leaf's traffic that leave it
    assert uplink_share("all_reduce", 32, 1, 32) == 0.0  # the ring fits one leaf
    assert uplink_share("all_reduce", 64, 1, 4) == 1 / 4  # enters and leaves each leaf of 4 nodes once
    assert uplink_share("all2all", 8, 1, 4) == 4 / 7  # 4 of the 7 other nodes are under other leaves
    assert uplink_share("p2p", 2, 8, 4) == 1.0 and uplink_share("p2p", 2, 1, 4) == 1 / 4
    # rate: B min(1, 1 / (o f))
    tor2 = tor.with_updates({"leaf_oversubscription": 2.0})  # 42 down-ports: 5 nodes per leaf
    assert nodes_per_leaf(tor2) == 5
    assert leaf_rate_factor(tor2, "all2all", 8, 1) == 1.0  # f = 3/7 (3 of 7 peers under other leaves), o f = 6/7
    assert leaf_rate_factor(tor2, "all2all", 16, 1) == 1 / (2 * 11 / 15)  # f = 11/15
    assert leaf_rate_factor(tor2, "all_reduce", 64, 1) == 1.0  # f = 1/5, o f = 0.4
    assert leaf_rate_factor(tor2, "p2p", 2, 8) == 0.5  # every pipeline send crosses: half the NIC rate


def test_oversubscribed_leaves_slow_cross_leaf_all_to_all_only() -> None:
    """EP64 over 8 DGX H100 nodes: on 4-node top-of-rack leaves at 4:1, the all-to-all's
    NIC part runs at 1 / (4 x 4/7) of the NIC rate; on rail-optimised leaves (51 nodes each)
    it does not leave the leaf."""
    from simumax.cost.network import ring_bytes

    st = StrategyConfig(seq_len=4096, world_size=64, ep_size=64)
    base = load_system("h100-sxm-80gb")
    tor = base.with_updates({"leaf_radix": 64, "leaf_oversubscription": 4.0, "rail_optimized": False})
    rail = tor.with_updates({"rail_optimized": True})
    c = Collective("all2all", 64e6, "ep")
    t0, t_tor, t_rail = (NetworkModel(y, st).time(c) for y in (base, tor, rail))
    assert t_rail == t0
    spec = base.networks.tiers["inter_node"]
    # the NIC part: an all-to-all of the buffer over the 8 nodes, 7/8 of it, on the tier's all-to-all line
    nic = ring_bytes(64e6, 8, 1, -1) / (spec.bandwidth.gbps * 1e9 * spec.op["all2all"].efficient_factor)
    assert nic == pytest.approx(64e6 * 56 / 64 / (50e9 * 0.70))
    # 6 nodes per leaf (51 down-ports / 8 NICs): f = 2/7, o f = 8/7; only the NIC part's bandwidth term grows
    assert abs((t_tor - t0) - nic * (4 * 2 / 7 - 1)) <= 1e-12
    dp = Collective("all_reduce", 1e9, "dp")
    assert NetworkModel(tor, st).time(dp) == NetworkModel(base, st).time(dp)  # DP = 1 here; nothing to do
    with pytest.raises(ConfigError, match="leaf_radix"):
        base.with_updates({"leaf_oversubscription": 2.0})
