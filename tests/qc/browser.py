"""Headless Chromium for the report tests: Debian's chromium and chromium-driver through
selenium. ``.ci/run`` installs both; elsewhere the tests skip, saying how to get them."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
# As the machine's own probe starts Chromium: without the background-networking flags it
# keeps trying to reach Google's hosts, which this closed network refuses.
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-dev-shm-usage", "--window-size=1300,1000")
HOW_TO_ENABLE = ("install Chromium and its driver (Debian: apt-get install chromium "
                 "chromium-driver; .ci/run does it as root) and selenium (pip install -e "
                 "'.[dev]')")


@contextmanager
def chromium_driver() -> Iterator:
    """A selenium Chrome driver on the system Chromium, or a pytest skip saying why; on
    leaving, the browser is quit and its profile folder deleted (each was left in the
    system's temporary folder, one per browser started)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip(f"selenium is not installed: {HOW_TO_ENABLE}")
    binary = next((shutil.which(name) for name in CHROMIUM if shutil.which(name)), None)
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip(f"no Chromium or chromedriver on PATH: {HOW_TO_ENABLE}")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    with tempfile.TemporaryDirectory(prefix="mriprep-chromium-",
                                     ignore_cleanup_errors=True) as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            yield driver
        finally:
            driver.quit()
