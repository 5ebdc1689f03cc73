"""The Space in a real browser: `spaces_demo/app.py` on localhost with a tiny random pair, driven by headless Chromium.

Needs Debian's chromium (`apt-get install -y chromium`) and the `playwright` Python package; no browser download.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import save_tiny_pair

from transformers_dflash import demo

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.is_file():
    pytest.skip(
        "Debian's chromium is missing: install it with `apt-get install -y chromium`.", allow_module_level=True
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install -e '.[demo]'")
pytest.importorskip("gradio", reason="needs gradio: pip install -e '.[demo]'")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip
APP = Path(__file__).resolve().parents[1] / "spaces_demo" / "app.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(root: Path, extra_env: dict[str, str]) -> Iterator[str]:
    """Serves `spaces_demo/app.py` from a subprocess on a free localhost port; yields its URL."""
    port = free_port()
    env = os.environ | {
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "GRADIO_SERVER_PORT": str(port),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        **extra_env,
    }
    log = (root / "app.log").open("w")
    process = subprocess.Popen([sys.executable, str(APP)], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 90
        while True:
            if process.poll() is not None:
                pytest.fail(f"the app exited with {process.returncode}:\n{(root / 'app.log').read_text()}")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the app did not answer within 90 s:\n{(root / 'app.log').read_text()}")
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()


@pytest.fixture(scope="module")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app with only the tiny pair available (the embedded drafter hidden)."""
    root = tmp_path_factory.mktemp("space")
    pairs = json.dumps(save_tiny_pair(root))
    yield from serve(root, {demo.PAIRS_ENV: pairs, "DFLASH_EMBEDDED_DRAFTER": str(root / "no-embedded-drafter")})


@pytest.fixture(scope="module")
def embedded_app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app as a visitor of the Space meets it: the embedded pair, nothing configured."""
    yield from serve(tmp_path_factory.mktemp("space-embedded"), {demo.PAIRS_ENV: ""})


def check_space(url: str, tmp_path: Path, note: str, prompt: str | None, max_new_tokens: int | None = None) -> str:
    """Drives the app in Chromium as a visitor would and asserts what they must see; returns the DFlash pane's text.

    `note` is expected in the pair note or the chosen pair's name; `prompt` None clicks the first example instead of typing; `max_new_tokens`
    (None: the default) is typed into the slider's number box. A screenshot lands in `tmp_path`.
    """
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1300},
        )  # fmt: skip
        try:
            page = browser.new_page()
            page.goto(url)
            shown = page.locator("#pair-note").inner_text(timeout=30_000) + page.locator("#pair input").input_value()
            assert note in shown
            if prompt is None:
                page.locator(".gallery-item, button.example").first.click()
                page.wait_for_function("document.querySelector('#prompt textarea').value.length > 0", timeout=10_000)
            else:
                page.locator("#prompt textarea").fill(prompt)
            if max_new_tokens is not None:
                page.locator("#max-new input[type=number]").fill(str(max_new_tokens))
                page.locator("#max-new input[type=number]").press("Enter")
            page.locator("#run").click()
            page.locator("#summary").get_by_text("Speed-up").wait_for(timeout=180_000)

            plain = page.locator("#plain-pane .dflash-pane").inner_text()
            fast = page.locator("#dflash-pane .dflash-pane").inner_text()
            assert plain.strip() and plain == fast
            assert "Identical output" in page.locator("#identical").inner_text()
            assert "tokens/s" in page.locator("#plain-speed").inner_text()
            assert "tokens/s" in page.locator("#dflash-speed").inner_text()
            assert "τ = " in page.locator("#summary").inner_text()
            first_token = page.locator("#dflash-pane .tok").first
            assert "prefill" in first_token.get_attribute("title") and "--c:" in first_token.get_attribute("style")
            assert page.locator("#dflash-pane .tok.bonus").count() > 0
            if max_new_tokens is not None:
                assert page.locator("#dflash-pane .tok").count() <= max_new_tokens
            page.locator("#histogram img").wait_for(timeout=10_000)
            page.screenshot(path=str(tmp_path / "space.png"), full_page=True)
            return fast
        finally:
            browser.close()


def test_space_runs_both_panes_and_shows_results(app_url: str, tmp_path: Path) -> None:
    check_space(app_url, tmp_path, "not available", "Hello DFlash")


@pytest.mark.integration
def test_space_on_the_embedded_pair(embedded_app_url: str, tmp_path: Path) -> None:
    """The Space's default: SmolLM2-135M-Instruct with the shipped drafter, an example prompt, 48 new tokens."""
    text = check_space(embedded_app_url, tmp_path, "SmolLM2", prompt=None, max_new_tokens=48)
    assert len(text.split()) >= 5  # real words from the real model, not a handful of random tokens
