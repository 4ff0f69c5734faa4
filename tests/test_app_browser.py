"""The web app end to end in a real browser: `simumax app` serves it, headless Debian
Chromium (driven by Playwright, no browser download) reads the numbers it shows and checks
them against the Python API for the same configs; then edits the strategy and runs a search.

Needs streamlit, playwright (`pip install "simumax[app,apptest]"`) and /usr/bin/chromium
(Debian package `chromium`; .ci/run installs it). Skipped, with the reason, without them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("Debian chromium is not installed (apt-get install chromium)", allow_module_level=True)

from simumax import PerfLLM  # noqa: E402
from simumax.config.loader import load_strategy  # noqa: E402
from simumax.search.table import search_csv  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHOT = Path(os.environ.get("SIMUMAX_APP_SCREENSHOT", "/tmp/simumax_app.png"))
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    port = _free_port()
    home = tmp_path_factory.mktemp("home")  # streamlit writes ~/.streamlit
    proc = subprocess.Popen([sys.executable, "-m", "simumax.cli", "app", "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "HOME": str(home)})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if urllib.request.urlopen(url + "/_stcore/health", timeout=1).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError("streamlit did not start: " + (proc.stdout.read1(4000).decode() if proc.stdout else ""))
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _metric(page, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]', has_text=label)
    box.wait_for(timeout=60_000)
    return box.locator('[data-testid="stMetricValue"]').inner_text().strip()


def _expected(updates: dict | None = None):
    st = load_strategy("tp1_pp2_dp4_mbs1")
    if updates:
        st = st.with_updates(updates, source="test")
    perf = PerfLLM().configure(strategy_config=st, model_config="llama3-8b", system_config="a100_pcie")
    return perf.analysis_cost(), perf.analysis_mem()


def test_app_shows_the_estimate_edits_and_searches(app_url) -> None:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(user_agent="simumax-test")
        page.goto(app_url, wait_until="domcontentloaded")
        cost, mem = _expected()
        assert _metric(page, "iteration time (ms)") == f"{cost.duration_time_per_iter * 1e3:.1f}"
        assert _metric(page, "MFU") == f"{cost.mfu:.1%}"
        assert _metric(page, "peak allocated (GiB)") == f"{mem.peak_mem / 2**30:.2f}"
        lo, hi = cost.duration_time_interval  # the 80 % band beside the time
        page.get_by_text(f"iteration time, 80 % band: {lo * 1e3:.1f}–{hi * 1e3:.1f} ms").wait_for(timeout=60_000)
        page.wait_for_function("document.querySelectorAll('[data-testid=\"stImage\"] img').length >= 2", timeout=60_000)  # the plots

        # edit the strategy: TP 2 on the same 8 GPUs (DP 4 -> 2: the job keeps its size)
        tp = page.get_by_label("TP", exact=True)
        tp.fill("2")
        tp.press("Enter")
        cost2, _ = _expected(TP2)
        page.get_by_text("DP = 2").wait_for(timeout=60_000)
        want = f"{cost2.duration_time_per_iter * 1e3:.1f}"
        page.wait_for_function(
            "w => [...document.querySelectorAll('[data-testid=\"stMetric\"]')].some(m => m.innerText.includes(w))", arg=want,
            timeout=60_000)
        assert _metric(page, "iteration time (ms)") == want

        # documents packed into each sequence (attention within each), then one per sequence again
        doc = page.get_by_label("document length (0: one document per sequence)", exact=True)
        doc.fill("1024")
        doc.press("Enter")
        page.get_by_text("docs 4x1024").wait_for(timeout=60_000)
        cost3, _ = _expected({**TP2, "document_lengths": 1024})
        packed = f"{cost3.duration_time_per_iter * 1e3:.1f}"
        page.wait_for_function(
            "w => [...document.querySelectorAll('[data-testid=\"stMetric\"]')].some(m => m.innerText.includes(w))", arg=packed,
            timeout=60_000)
        assert packed != want and _metric(page, "iteration time (ms)") == packed
        doc.fill("0")
        doc.press("Enter")
        page.wait_for_function(
            "w => [...document.querySelectorAll('[data-testid=\"stMetric\"]')].some(m => m.innerText.includes(w))", arg=want,
            timeout=60_000)

        # a small search (the batch set explicitly: the field keeps what it showed first)
        for label, value in (("GPUs", "8"), ("global batch (sequences)", "32")):
            page.get_by_label(label, exact=True).fill(value)
            page.get_by_label(label, exact=True).press("Enter")
        page.get_by_role("button", name="run search").click()
        page.get_by_text("strategies fit").wait_for(timeout=120_000)
        page.get_by_role("button", name="download search (CSV)").wait_for(timeout=60_000)
        page.locator('[data-testid="stDataFrame"]').wait_for(timeout=60_000)  # the grid loads its own script
        page.screenshot(path=str(SHOT), full_page=True)
        rows = _expected_search(TP2)
        assert page.get_by_text(f"{sum(r.fits for r in rows)} of {len(rows)} strategies fit").count() == 1
        with page.expect_download(timeout=60_000) as dl:  # the CLI's search.csv for the same rows
            page.get_by_role("button", name="download search (CSV)").click()
        assert Path(dl.value.path()).read_text() == search_csv(rows)

        # upload a model file: the estimate follows it
        page.locator('input[type="file"]').first.set_input_files(str(ROOT / "src/simumax/config/presets/models/llama2-7b.json"))
        page.get_by_text("llama2_7b |").wait_for(timeout=60_000)
        browser.close()


def _choose(page, label: str, option: str) -> None:
    """Pick an option of a Streamlit selectbox by typing it."""
    page.get_by_label(label).click()
    page.keyboard.type(option)
    page.keyboard.press("Enter")


def test_app_moe_with_uneven_stages_and_a_moe_search(app_url) -> None:
    """DeepSeek-V3 (61 layers) on PP2: the split error is plain text and the first-stage
    control resolves it; then a MoE search on B200 (EP 8/16/32) finds fitting strategies."""
    from simumax.config.loader import load_model, load_system
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(user_agent="simumax-test")
        page.goto(app_url, wait_until="domcontentloaded")
        _metric(page, "iteration time (ms)")
        _choose(page, "model preset", "deepseek-v3")
        page.get_by_text("must split evenly").wait_for(timeout=60_000)  # as written, no markdown
        first = page.get_by_label("layers, first stage (0: even)", exact=True)
        first.fill("30")
        first.press("Enter")
        page.get_by_text("deepseek-v3 |").wait_for(timeout=60_000)
        st = load_strategy("tp1_pp2_dp4_mbs1").with_updates({**APP, "num_layers_in_first_pipeline_stage": 30}, source="test")
        perf = PerfLLM().configure(strategy_config=st, model_config="deepseek-v3", system_config="a100_pcie")
        want = f"{perf.analysis_cost().duration_time_per_iter * 1e3:.1f}"
        assert _metric(page, "iteration time (ms)") == want

        _choose(page, "system preset", "b200-sxm-180gb")
        page.get_by_text("b200-sxm-180gb |").wait_for(timeout=60_000)
        for label, value in (("GPUs", "256"), ("global batch (sequences)", "4096"), ("TP sizes", "1,2"), ("EP sizes", "8,16,32")):
            box = page.get_by_label(label, exact=True)
            box.fill(value)
            box.press("Enter")
        page.get_by_role("button", name="run search").click()
        page.get_by_text("strategies fit").wait_for(timeout=180_000)
        space = SearchSpace(world_size=256, global_batch_size=4096, tp=(1, 2), pp=None, vp=(1,), ep=(8, 16, 32), etp=(1,), cp=(1,),
                            mbs=(1,), recompute=("none", "selective", "full_block"), zero=(1,), schedule=(None,))
        rows = run_search(load_model("deepseek-v3"), load_system("b200-sxm-180gb"), st, space)
        fit = sum(r.fits for r in rows)
        assert fit > 0
        assert page.get_by_text(f"{fit} of {len(rows)} strategies fit").count() == 1
        page.screenshot(path=str(SHOT.with_name("simumax_app_moe.png")), full_page=True)
        browser.close()


def test_app_reads_a_hugging_face_config(app_url, tmp_path) -> None:
    """A Hugging Face config.json dropped on the model uploader reads as `simumax import hf`
    reads it (here a 4-layer Qwen3-Next: Gated DeltaNet and gated attention over 512 experts),
    its notes under the uploader, and the estimate is the API's for that model."""
    import json

    from simumax.importers.hf import model_from_hf
    from tests.test_gated_deltanet import QWEN3_NEXT_80B

    cfg = {**QWEN3_NEXT_80B, "num_hidden_layers": 4}
    path = tmp_path / "qwen3_next_small.json"
    path.write_text(json.dumps(cfg))
    model, _ = model_from_hf(cfg, "qwen3_next_small", path.name)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(user_agent="simumax-test")
        page.goto(app_url, wait_until="domcontentloaded")
        _metric(page, "iteration time (ms)")
        page.locator('input[type="file"]').first.set_input_files(str(path))
        page.get_by_text("qwen3_next_small |").wait_for(timeout=60_000)
        page.get_by_text("note: zero-centred RMSNorm weights").wait_for(timeout=60_000)
        st = load_strategy("tp1_pp2_dp4_mbs1").with_updates(APP, source="test")
        perf = PerfLLM().configure(strategy_config=st, model_config=model, system_config="a100_pcie")
        assert _metric(page, "iteration time (ms)") == f"{perf.analysis_cost().duration_time_per_iter * 1e3:.1f}"
        browser.close()


# what the app's sidebar sets on top of the preset (SP follows TP; even stages are null)
APP = {"enable_sequence_parallel": False, "num_layers_in_first_pipeline_stage": None, "num_layers_in_last_pipeline_stage": None}
TP2 = {**APP, "tp_size": 2, "enable_sequence_parallel": True}


def _expected_search(updates: dict):
    """The API's search over the app's space (its defaults, TP 1/2/4/8 on 8 GPUs)."""
    from simumax.config.loader import load_model, load_system
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace

    st = load_strategy("tp1_pp2_dp4_mbs1").with_updates(updates, source="test")
    space = SearchSpace(world_size=8, global_batch_size=32, tp=(1, 2, 4, 8), pp=None, vp=(1,), ep=(1,), etp=(1,),
                        cp=(1,), mbs=(1,), recompute=("none", "selective", "full_block"), zero=(1,), schedule=(None,))
    return run_search(load_model("llama3-8b"), load_system("a100_pcie"), st, space)
