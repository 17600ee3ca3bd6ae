"""The QC report of the demo cache, opened in a real browser (headless Chromium)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tests.qc.browser import chromium_driver

pytestmark = pytest.mark.slow

# Every picture must load: lazy ones are scrolled to first. A picture that fails to load
# has complete == true and naturalWidth == 0.
_IMAGES_STATE = """
return Array.from(document.images).map(img => [img.getAttribute('src'), img.complete,
                                               img.naturalWidth]);
"""


@pytest.fixture(scope="module")
def browser():
    with chromium_driver() as driver:
        yield driver


def _load_all_images(driver) -> list:
    from selenium.webdriver.support.ui import WebDriverWait

    for image in driver.find_elements("tag name", "img"):
        driver.execute_script("arguments[0].scrollIntoView();", image)
    WebDriverWait(driver, 20).until(
        lambda d: all(done for _, done, _ in d.execute_script(_IMAGES_STATE)))
    return driver.execute_script(_IMAGES_STATE)


def _errors(driver) -> list:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def test_index_lists_every_subject_and_loads_clean(browser, demo_cache):
    report = demo_cache.run.report_paths["qc"]
    browser.get(report.resolve().as_uri())
    assert _errors(browser) == []
    images = _load_all_images(browser)
    assert images and all(width > 0 for _, _, width in images), images
    rows = browser.find_elements("css selector", "#subjects tbody tr")
    shown = {(r.get_attribute("data-subject"), r.get_attribute("data-status")) for r in rows}
    expected = set()
    for result in demo_cache.run.results:
        status = "failed" if result.failed else "cached"
        name = result.subject_id + (f" {result.session_id}" if result.session_id else "")
        expected.add((name, status))
    assert shown == expected
    assert {s for _, s in shown} == {"cached", "failed"}
    # The table sorts: clicking the SNR column orders the cached rows by their value.
    header = browser.find_element("xpath", "//table[@id='subjects']//th[text()='SNR']")
    header.click()
    column = [h.text for h in browser.find_elements("css selector", "#subjects th")].index("SNR")
    values = [float(r.find_elements("tag name", "td")[column].get_attribute("data-value"))
              for r in browser.find_elements("css selector", "#subjects tbody tr")]
    finite = [v for v in values if np.isfinite(v)]
    assert finite == sorted(finite) and len(finite) == sum(s == "cached" for _, s in shown)
    assert _errors(browser) == []


@pytest.mark.parametrize("status", ["cached", "failed"])
def test_subject_pages_load_and_show_anatomy(browser, demo_cache, status):
    from PIL import Image

    browser.get(demo_cache.run.report_paths["qc"].resolve().as_uri())
    link = browser.find_element(
        "css selector", f"#subjects tbody tr[data-status='{status}'] a")
    link.click()
    assert _errors(browser) == []
    images = _load_all_images(browser)
    assert images and all(width > 0 for _, _, width in images), images
    section = browser.find_element("id", "subject")
    assert section.get_attribute("data-status") == status
    shot = np.asarray(Image.open(io.BytesIO(section.screenshot_as_png)).convert("L"),
                      dtype=float)
    # Not blank: the mosaics' anatomy spreads the grey levels widely.
    assert shot.std() > 20 and len(np.unique(shot)) > 50
    assert _errors(browser) == []
