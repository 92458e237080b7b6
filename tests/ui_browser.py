"""The MLflow UI in headless Chromium (Debian's package, driven by Playwright): what a person would see.

    MPI_TRAIN_SCREENSHOTS=docs python -m pytest tests/tracking/test_ui.py    # also rewrites the README's pictures
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
# As root in a container, with nothing of the network but the server: no sandbox, no background traffic.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def why_no_browser() -> str | None:
    """Why the browser checks cannot run here, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401 - only whether it is installed
    except ImportError:
        return "Playwright is not installed (pip install -e '.[test]' installs it)"
    if not any(Path(path).exists() for path in CHROMIUM) and shutil.which("chromium") is None:
        return "Chromium is not installed (apt-get install chromium; .ci/run installs it as root)"
    return None


@contextmanager
def browser_page(width: int = 1600, height: int = 1000):
    """A fresh headless Chromium page, closed on leaving."""
    from playwright.sync_api import sync_playwright

    executable = next((path for path in CHROMIUM if Path(path).exists()), shutil.which("chromium"))
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=executable, args=FLAGS)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def settle(page, text: str, timeout_s: float = 90) -> None:
    """Wait until `text` shows, then close the assistant panel and the shared-view banner that cover the runs."""
    page.get_by_text(text).first.wait_for(timeout=timeout_s * 1000)
    for label in ("Close", "Hide banner"):
        button = page.locator(f"button[aria-label='{label}']")
        if button.count():
            button.first.click()
    page.wait_for_timeout(1500)  # charts draw after the data arrives


def keep_screenshot(page, name: str) -> None:
    """Write a screenshot into $MPI_TRAIN_SCREENSHOTS (the README's come from here), when it is set."""
    folder = os.environ.get("MPI_TRAIN_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name))
