"""``presets``, ``schema`` and ``app``: what ships, the config formats, the web app."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from simumax import cli  # the app and its consoles (cli.out_console is read at call time: tools swap it)
from simumax.atomic import dumps_finite
from simumax.config.loader import list_presets, load_model, load_strategy
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError


@cli.app.command("app")
def app_cmd(
    port: int = typer.Option(8501, "--port", help="Port to serve on."),
    browser: bool = typer.Option(False, "--browser/--no-browser", help="Open a browser tab."),
) -> None:
    """Start the web app (pip install 'simumax\\[app]')."""
    import importlib.util
    import os

    if importlib.util.find_spec("streamlit") is None:
        raise ConfigError("app", "needs Streamlit: pip install 'simumax[app]'")
    script = Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py"
    cmd = [sys.executable, "-m", "streamlit", "run", str(script), "--server.port", str(port),
           "--server.headless", "false" if browser else "true", "--browser.gatherUsageStats", "false"]
    sys.stdout.flush()
    # become the server (no child process): a signal to this process stops the server
    # instead of orphaning it
    os.execv(sys.executable, cmd)


@cli.app.command()
def presets(
    kind: Optional[str] = typer.Argument(None, help="model, strategy or system (default all)."),
    as_json: bool = typer.Option(False, "--json", help="Print {kind: \\[names]} as JSON."),
) -> None:
    """List the shipped presets."""
    kinds = [kind] if kind else ["model", "strategy", "system"]
    for k in kinds:
        if k not in ("model", "strategy", "system"):
            raise ConfigError("kind", "must be model, strategy or system")
    from simumax.config.hardware import preset_provenance

    if as_json:
        payload: dict[str, Any] = {k: list_presets(k) for k in kinds}
        if "system" in kinds:  # which system presets are measured and which derived
            payload["system_provenance"] = {n: preset_provenance(n) for n in list_presets("system")}
        cli.out_console.print_json(dumps_finite(payload))
        return
    for k in kinds:
        cli.out_console.print(f"[bold]{k}[/]:")
        # a grid: a long description wraps inside its own column at any terminal width
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")
        for n in list_presets(k):
            grid.add_row(Text(f"  {n}"), Text(_preset_line(k, n)))
        cli.out_console.print(grid)
        if k == "system":
            cli.out_console.print("  a derived preset on your cluster: `simumax import nccl-tests` fits its network to your "
                                  "nccl-tests results, `simumax fit-runs` its resources to your own runs "
                                  "(docs/calibration.md)", markup=False)


def _preset_line(kind: str, name: str) -> str:
    """One line that says what a preset is (its size, its layout, where its numbers come from)."""
    if kind == "system":
        from simumax.config.hardware import preset_provenance

        return preset_provenance(name)
    if kind == "strategy":
        st = load_strategy(name)
        parts = [f"tp{st.tp_size} pp{st.pp_size} dp{st.dp_size}"] + ([f"ep{st.ep_size}"] if st.ep_size > 1 else [])
        parts += [f"{st.world_size} GPUs", f"mbs {st.micro_batch_size} x {st.micro_batch_num}", f"recompute {st.recompute_mode}"]
        return ", ".join(parts)
    m = load_model(name)
    kind_text = f"MoE {m.expert_num} experts top-{m.topk}" if m.is_moe else "dense"
    origin = " (SimuMax's file as it ships it)" if name in SIMUMAX_MODEL_FILES else ""
    twin = SIMUMAX_COUNTERPARTS.get(name)
    if twin is not None:
        theirs, ours = m.model_dump(), load_model(twin).model_dump()
        differ = [k for k in theirs if k != "model_name" and theirs[k] != ours[k]]
        shown = ", ".join(differ[:4]) + (" ..." if len(differ) > 4 else "")
        origin = f" (SimuMax's file as it ships it; the published model is {twin}, which differs in {shown})"
    if m.experimental_attention_variant == "dsa":
        kind_text += f", DeepSeek sparse attention top-{m.dsa_indexer_topk} (dsa_kernel_backend tilelang, apply_rope_fusion false)"
    return f"{kind_text}, {m.layer_num} layers, hidden {m.hidden_size}, vocabulary {m.vocab_size}{origin}"


# model presets that are SimuMax's own files, kept unchanged for its users (our presets of the
# same models carry the published architecture: deepseek-v3, llama3.1-8b, kimi-k2, ...)
SIMUMAX_MODEL_FILES = frozenset({
    'aquila2-13b', 'aquila2-34b', 'aquila2-70b', 'aquila2-7b', 'deepseek-16b', 'deepseek-1b', 'deepseek-32b',
    'deepseekv2', 'deepseekv2-lite', 'deepseekv3', 'gpt3-175b', 'kimi-1T', 'ling-1T', 'llama-33b',
    'llama2-13b', 'llama2-70b', 'llama2-7b', 'llama2-tiny', 'llama3-405b_padding_128', 'llama3-70b',
    'llama3-8b', 'megatron-1t', 'megatron-22b', 'megatron-530b', 'mixtral-8x1b', 'mixtral-8x7b', 'moe-8T',
    'qwen3-32b',
})
# SimuMax files of a model we also ship as published (routing, padding, vocabulary as released):
# not two names for one model, two configurations of it; `presets` says how they differ
SIMUMAX_COUNTERPARTS = {
    "deepseekv2": "deepseek-v2", "deepseekv2-lite": "deepseek-v2-lite", "deepseekv3": "deepseek-v3", "kimi-1T": "kimi-k2",
    "llama3-8b": "llama3.1-8b", "llama3-70b": "llama3.1-70b", "llama3-405b_padding_128": "llama3.1-405b",
}


@cli.app.command()
def schema(kind: str = typer.Argument(..., help="model, strategy or system.")) -> None:
    """Print the JSON Schema of one config format (for editors)."""
    classes = {"model": ModelConfig, "strategy": StrategyConfig, "system": SystemConfig}
    if kind not in classes:
        raise ConfigError("kind", "must be model, strategy or system")
    sys.stdout.write(json.dumps(classes[kind].model_json_schema(), indent=2) + "\n")
