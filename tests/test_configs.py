"""Config formats: every SimuMax file loads unchanged; presets ship in the package."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from simumax import ModelConfig, StrategyConfig, SystemConfig
from simumax.config.loader import list_presets, load_model, load_strategy, load_system
from tests.conftest import REFERENCE, ROOT, needs_shared

KIND_CLASS = {"models": ModelConfig, "strategy": StrategyConfig, "system": SystemConfig}


def _reference_files() -> list[Path]:
    return sorted(REFERENCE.glob("*/*.json")) if REFERENCE.is_dir() else []


@needs_shared
@pytest.mark.parametrize("path", _reference_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reference_config_loads_unchanged(path: Path) -> None:
    cfg = KIND_CLASS[path.parent.name].init_from_config_file(path)
    # every field of the file is kept with its value
    raw = json.loads(path.read_text())
    dumped = cfg.to_dict()
    for key, value in raw.items():
        if isinstance(value, dict):
            continue
        assert dumped[key] == value, key


def test_presets_by_name() -> None:
    assert "llama3-8b" in list_presets("model")
    assert "a100_pcie" in list_presets("system")
    assert "tp1_pp2_dp4_mbs1" in list_presets("strategy")
    assert load_model("llama3-70b").hidden_size == 8192
    assert load_strategy("tp2_pp1_dp4_mbs1").dp_size == 4
    assert load_system("b200_bf16_ceperm").num_per_node == 8


def test_system_roundtrip_keeps_simumax_layout() -> None:
    sy = load_system("a100_pcie")
    d = sy.to_dict()
    assert d["networks"]["intra_with_pcie"] is True
    assert "intra_node_pcie_8x" in d["networks"]
    assert SystemConfig.init_from_dict(d) == sy


def test_vocab_padding_megatron_rule() -> None:
    m = load_model("llama3-8b")  # vocab 128257
    assert m.padded_vocab(1) == 128384
    assert m.padded_vocab(2) == 128512
    assert m.padded_vocab(8) == 129024
    assert m.with_updates({"padded_vocab_size": False}).padded_vocab(8) == 128257


def test_wheel_contains_presets(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
    )
    wheel = next(tmp_path.glob("simumax-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for preset in ("models/llama3-8b.json", "system/a100_pcie.json", "strategy/tp1_pp2_dp4_mbs1.json"):
        assert f"simumax/config/presets/{preset}" in names


def test_config_docs_are_current() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_config_docs", ROOT / "docs" / "make_config_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (ROOT / "docs" / "configs.md").read_text() == mod.render(), "run python docs/make_config_docs.py"


def test_preset_names_in_any_spelling() -> None:
    """Case and _ / - do not matter in preset names (one spelling per preset); an unknown name
    suggests the nearest ones."""
    import pytest

    from simumax.config.loader import load_model, load_system
    from simumax.errors import ConfigError

    assert load_system("H100_SXM_80GB").sys_name == load_system("h100-sxm-80gb").sys_name
    assert load_model("deepseek_v3").model_name == "deepseek-v3"
    assert load_model("deepseekv3").model_name == "deepseek_v3"  # SimuMax's file keeps its own name
    with pytest.raises(ConfigError, match="did you mean llama3-70b, llama3-8b"):
        load_model("llama3-8")
    # the start of a name suggests the few presets it begins
    with pytest.raises(ConfigError, match="did you mean h100-nvl-94gb, h100-pcie-80gb, h100-sxm-80gb"):
        load_system("h100")
    with pytest.raises(ConfigError) as exc:
        load_model("l")  # begins more than a few (llama*): no list of them
    assert "did you mean" not in exc.value.rule


def test_snapshot_sees_every_in_place_edit() -> None:
    """PerfLLM's change check (config/base.snapshot): equal while nothing changes, different
    after an assignment, an edit inside a table (a dict), a list or a nested config."""
    from simumax.config.base import snapshot

    system, strategy = load_system("h100-sxm-80gb"), load_strategy("tp1_pp2_dp4_mbs1")
    before_sys, before_st = snapshot(system), snapshot(strategy)
    assert snapshot(system) == before_sys and snapshot(strategy) == before_st
    from simumax.config.base import snapshot_field

    assert snapshot_field(before_sys, "accelerator") == snapshot(system.accelerator)  # ComputeModel's key
    table = system.accelerator.op["matmul"].accurate_efficient_factor
    key = next(iter(table))
    table[key] *= 0.5  # a table entry, in place
    assert snapshot(system) != before_sys
    table[key] *= 2.0
    assert snapshot(system) == before_sys
    system.networks.tiers["inter_node"].bandwidth.gbps *= 2  # a nested config's field
    assert snapshot(system) != before_sys
    strategy.offload_modules.append("core_attn")  # a list field, in place
    assert snapshot(strategy) != before_st
    assert "offload_modules" in type(strategy)._plain_fields and "accurate_efficient_factor" in type(
        system.accelerator.op["matmul"])._plain_fields
    # a snapshot copies only the fields whose annotation allows more than an atom: every
    # other field of every config reachable from the shipped presets holds an atom
    from simumax.config.base import _ATOMS, ConfigBase
    from simumax.config.loader import load_model

    def atoms_elsewhere(cfg: object) -> int:
        if isinstance(cfg, dict):
            return sum(atoms_elsewhere(v) for v in cfg.values())
        if not isinstance(cfg, ConfigBase):
            return 0
        kind = type(cfg)
        for name, value in cfg.__dict__.items():
            assert name in kind._container_fields or type(value) in _ATOMS, (kind.__name__, name)
        return 1 + sum(atoms_elsewhere(cfg.__dict__[n]) for n in kind._container_fields)

    assert atoms_elsewhere(system) > 20 and atoms_elsewhere(strategy) == 1 == atoms_elsewhere(load_model("llama3-8b"))


def test_fingerprint_sees_every_in_place_edit_on_its_fast_path() -> None:
    """PerfLLM's change check without taking the snapshots again (config/base.Fingerprint):
    while no field was assigned anywhere it compares the dicts and lists it saw with their
    copies; every kind of edit is seen, an undone edit matches again, other objects with
    the same contents match, and a copy or a pickle checks by its snapshots."""
    import copy
    import pickle

    from simumax.config.base import ConfigBase, Fingerprint
    from simumax.config.loader import load_model

    def fresh() -> tuple[object, ...]:
        return load_model("llama3-8b"), load_strategy("tp1_pp2_dp4_mbs1"), load_system("h100-sxm-80gb")

    configs = fresh()
    model, strategy, system = configs
    fp = Fingerprint(configs)
    edits = ConfigBase.edits
    assert fp.matches(configs) and ConfigBase.edits == edits
    table = system.accelerator.op["matmul"].accurate_efficient_factor
    key = next(iter(table))
    table[key] *= 0.5  # inside a table: no assignment counted, the fast path must see it
    assert ConfigBase.edits == edits and not fp.matches(configs)
    table[key] *= 2.0
    assert fp.matches(configs)
    strategy.offload_modules.append("core_attn")  # a list
    assert not fp.matches(configs)
    strategy.offload_modules.pop()
    system.accelerator.op["extra"] = system.accelerator.op["matmul"]  # a dict of configs
    assert not fp.matches(configs)
    del system.accelerator.op["extra"]
    assert fp.matches(configs)
    system.networks.tiers["inter_node"].bandwidth.gbps *= 2  # a nested config's field
    assert ConfigBase.edits > edits and not fp.matches(configs)
    system.networks.tiers["inter_node"].bandwidth.gbps /= 2
    assert fp.matches(configs)  # the same contents again: watched from here on
    model.layer_num = model.layer_num  # an equal value
    assert fp.matches(configs)
    assert fp.matches(fresh()) and not fp.matches((model, strategy, load_system("a100_pcie")))
    for other in (copy.deepcopy(fp), pickle.loads(pickle.dumps(fp))):
        assert other.matches(other.configs)
        other.configs[0].layer_num = 2
        assert not other.matches(other.configs)
