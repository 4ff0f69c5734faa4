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
    assert "default efficiency curves" in preset_provenance("gb200-nvl72")
    text = run_cli("presets", "system").stdout
    assert "a100-sxm-80gb" in text and "derived" in text and "measured" in text
    payload = json.loads(run_cli("presets", "system", "--json").stdout)
    assert set(payload["system_provenance"]) == set(payload["system"])
