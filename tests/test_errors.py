"""Bad input raises one ConfigError naming the field; the CLI prints one line, exits 2."""

from __future__ import annotations

import pytest

from simumax import ConfigError, PerfLLM, StrategyConfig
from simumax.config.loader import load_model, load_strategy, load_system
from tests.conftest import run_cli

BASE = load_strategy("tp1_pp2_dp4_mbs1").to_dict()


def strategy(**kw):
    return StrategyConfig.init_from_dict({**BASE, **kw})


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"tp_size": 3}, "world_size"),
        ({"world_size": 0}, "world_size"),
        ({"seq_len": -1}, "seq_len"),
        ({"bogus_field": 1}, "bogus_field"),
        ({"micro_batch_num": "many"}, "micro_batch_num"),
        ({"interleaving_size": 2, "pp_size": 1}, "interleaving_size"),
        ({"megatron_recompute": True, "megatron_recompute_modules": ["nope"]}, "megatron_recompute_modules"),
        ({"tp_size": 8, "pp_size": 1, "seq_len": 4100}, "seq_len"),
        ({"use_math_sdp": True, "use_flash_sdp": True}, "use_math_sdp"),
        ({"zero_state": 4}, "zero_state"),
    ],
)
def test_strategy_errors_name_the_field(kw, field) -> None:
    with pytest.raises(ConfigError) as exc:
        strategy(**kw)
    assert exc.value.field == field
    with pytest.raises(ConfigError) as exc:  # built in a script, not loaded: the same error
        StrategyConfig(**{**BASE, **kw})
    assert exc.value.field == field


@pytest.mark.parametrize(
    "model_kw, strat_kw, field",
    [
        ({"head_num": 12, "kv_head_num": 4, "hidden_size": 768}, {"tp_size": 8, "pp_size": 1}, "tp_size"),
        ({"kv_head_num": 8}, {"tp_size": 8, "pp_size": 1, "world_size": 8}, None),  # legal
        ({"layer_num": 3}, {"pp_size": 4, "world_size": 8}, "pp_size"),
        ({"layer_num": 7}, {"pp_size": 2}, "pp_size"),
    ],
)
def test_cross_checks(model_kw, strat_kw, field) -> None:
    m = load_model("llama3-8b").with_updates(model_kw)
    p = PerfLLM()
    if field is None:
        p.configure(model_config=m, strategy_config=strategy(**strat_kw), system_config="a100_pcie").run_estimate()
        return
    with pytest.raises(ConfigError) as exc:
        p.configure(model_config=m, strategy_config=strategy(**strat_kw), system_config="a100_pcie").run_estimate()
    assert exc.value.field == field


def test_uneven_first_last_stage() -> None:
    m = load_model("llama3-8b")
    s = strategy(pp_size=4, world_size=8, num_layers_in_first_pipeline_stage=6, num_layers_in_last_pipeline_stage=8)
    est = PerfLLM().configure(model_config=m, strategy_config=s, system_config="a100_pcie").estimate
    assert [len(st.layers) for st in est.stages] == [6, 9, 9, 8]
    with pytest.raises(ConfigError):
        PerfLLM().configure(
            model_config=m, strategy_config=strategy(pp_size=4, world_size=8, num_layers_in_first_pipeline_stage=6),
            system_config="a100_pcie",
        ).run_estimate()


def test_missing_file_and_bad_json(tmp_path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_system(tmp_path / "missing.json")
    assert exc.value.field == "path"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError) as exc:
        load_model(bad)
    assert exc.value.field == "json"
    with pytest.raises(ConfigError) as exc:
        load_model("no-such-model")
    assert "unknown preset" in exc.value.rule


def test_unknown_field_suggests_the_field_meant() -> None:
    with pytest.raises(ConfigError, match="did you mean tp_size"):
        StrategyConfig(**{**BASE, "tp_sizee": 2})
    with pytest.raises(ConfigError, match="did you mean micro_batch_num"):
        strategy(micro_batch_nun=2)


def test_set_suggests_the_field_meant() -> None:
    from simumax.cli.options import apply_overrides

    m, st, sy = load_model("llama3-8b"), load_strategy("tp1_pp2_dp4_mbs1"), load_system("a100_pcie")
    with pytest.raises(ConfigError, match="did you mean strategy.tp_size"):
        apply_overrides(m, st, sy, ["strategy.tp_sizee=2"])
    with pytest.raises(ConfigError, match="did you mean micro_batch_num"):
        apply_overrides(m, st, sy, ["micro_batch_nun=2"])


def test_set_keeps_text_fields_as_written() -> None:
    """A text field given a number-looking value keeps the text (TE 2.10 is not 2.1); numbers
    stay numbers elsewhere."""
    from simumax.cli.options import apply_overrides

    m, st, sy = load_model("llama3-8b"), load_strategy("tp1_pp2_dp4_mbs1"), load_system("a100_pcie")
    m2, st2, _ = apply_overrides(m, st, sy, ["strategy.te_version=2.10", "model.model_name=405", "seq_len=2048"])
    assert st2.te_version == "2.10" and st2.te_at_least("2.7") and m2.model_name == "405" and st2.seq_len == 2048


@pytest.mark.parametrize(
    "args",
    [
        ["perf", "--model", "no-such", "--system", "a100_pcie", "--strategy", "tp1_pp2_dp4_mbs1"],
        ["perf", "--model", "llama3-8b", "--system", "a100_pcie", "--strategy", "tp1_pp2_dp4_mbs1", "--set", "tp_size=3"],
        ["perf", "--model", "llama3-8b", "--system", "a100_pcie", "--strategy", "/nonexistent/s.json"],
        ["perf", "--model", "llama3-8b", "--system", "a100_pcie", "--strategy", "tp1_pp2_dp4_mbs1", "--set", "nope=1"],
    ],
)
def test_cli_bad_input_one_line_exit_2(args) -> None:
    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_help_texts_keep_their_brackets() -> None:
    # rich would read [app] or [model.|...] as markup tags and drop them
    from typer.testing import CliRunner

    from simumax.cli import app

    runner = CliRunner()
    wants = {("--help",): "simumax[app]", ("perf", "--help"): "[model.|strategy.|system.]key=value",
             ("search", "--help"): "simumax[ray]", ("presets", "--help"): "{kind: [names]}"}
    for args, want in wants.items():
        r = runner.invoke(app, list(args), env={"COLUMNS": "200"})
        assert r.exit_code == 0 and want in r.output, (args, r.output)
