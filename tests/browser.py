"""A real headless browser (Debian's chromium) for report.html: the DOM after the page's script ran, and a
screenshot. ``python3 tests/browser.py REPORT.html PNG`` refreshes docs/report-sample.png from a report."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--disable-extensions", "--disable-background-networking", "--hide-scrollbars"]


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _run(args: list[str], timeout: float = 90.0) -> subprocess.CompletedProcess:
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed (apt-get install -y chromium)")
    profile = tempfile.mkdtemp(prefix="ckh-chromium-")  # a profile of its own: parallel tests, no stale locks
    try:
        return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                              timeout=timeout, check=True, start_new_session=True)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def dump_dom(page: Path) -> str:
    """The page's DOM after its scripts ran, as chromium serialises it."""
    return _run(["--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri()]).stdout


def screenshot(page: Path, png: Path, width: int = 1280, height: int = 1600) -> Path:
    _run([f"--screenshot={png.resolve()}", f"--window-size={width},{height}", "--virtual-time-budget=5000",
          page.resolve().as_uri()])
    return png


if __name__ == "__main__":
    print(screenshot(Path(sys.argv[1]), Path(sys.argv[2])))
