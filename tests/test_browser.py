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
from test_demo import save_tiny_pair

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


@pytest.fixture(scope="module")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app served from a subprocess, with only the tiny pair available (the embedded drafter hidden)."""
    root = tmp_path_factory.mktemp("space")
    port = free_port()
    env = os.environ | {
        demo.PAIRS_ENV: json.dumps(save_tiny_pair(root)),
        "DFLASH_EMBEDDED_DRAFTER": str(root / "no-embedded-drafter"),
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "GRADIO_SERVER_PORT": str(port),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
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


def test_space_runs_both_panes_and_shows_results(app_url: str, tmp_path: Path) -> None:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1300},
        )  # fmt: skip
        try:
            page = browser.new_page()
            page.goto(app_url)
            assert "not available" in page.locator("#pair-note").inner_text(timeout=30_000)
            page.locator("#prompt textarea").fill("Hello DFlash")
            page.locator("#run").click()
            page.locator("#summary").get_by_text("Speed-up").wait_for(timeout=60_000)

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
            page.locator("#histogram img").wait_for(timeout=10_000)
            page.screenshot(path=str(tmp_path / "space.png"), full_page=True)
        finally:
            browser.close()
