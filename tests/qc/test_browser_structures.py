"""The QC report's per-structure table and the check's flags, opened in a real browser
(headless Chromium) on a small checked cache (tests/check/flagged_cache.py: sub-01's
hippocampi swapped, a label-side-swap error)."""

from __future__ import annotations

import pytest

from mriprep.qc.report import write_report
from tests.check.flagged_cache import flagged_cache
from tests.qc.browser import chromium_driver

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = flagged_cache(tmp_path_factory.mktemp("browser") / "c", check=True)
    return write_report(root)


@pytest.fixture(scope="module")
def browser():
    with chromium_driver() as driver:
        yield driver


def _errors(driver) -> list:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def test_flags_on_the_index_and_the_structure_table_on_the_page(browser, report):
    browser.get(report.resolve().as_uri())
    assert _errors(browser) == []
    assert browser.find_element("id", "check-count").text.startswith(
        "2 flagged by the check of ")
    headers = [h.text for h in browser.find_elements("css selector", "#subjects th")]
    column = headers.index("check")
    shown = {r.get_attribute("data-subject"): r.find_elements("tag name", "td")[column]
             for r in browser.find_elements("css selector", "#subjects tbody tr")}
    assert {s: c.text for s, c in shown.items()} == {
        "sub-00": "", "sub-01": "label-side-swap", "sub-02": "label-misfit"}
    assert "flag" in shown["sub-01"].get_attribute("class")
    assert shown["sub-01"].value_of_css_property("background-color") != \
        shown["sub-00"].value_of_css_property("background-color")

    browser.find_element("css selector", "#subjects tr[data-subject='sub-01'] a").click()
    assert _errors(browser) == []
    finding = browser.find_element("css selector", "#check-findings tbody tr")
    assert finding.is_displayed()
    assert [c.text for c in finding.find_elements("tag name", "td")][:2] == [
        "error", "label-side-swap"]
    assert "Hippocampus" in finding.text
    table = browser.find_element("id", "structures")
    assert table.is_displayed()
    cells = {r.find_elements("tag name", "td")[1].text: [c.text for c in r.find_elements(
        "tag name", "td")] for r in table.find_elements("css selector", "tbody tr")}
    value, name, voxels, mm3, share = cells["Left-Hippocampus"]
    assert value == "17" and int(voxels) > 0 and mm3 == voxels and 0.5 < float(share) < 2
    # sorts by volume, largest first on the second click
    header = table.find_element("xpath", ".//th[text()='volume (mm³)']")
    header.click()
    header.click()
    first = table.find_elements("css selector", "tbody tr")[0]
    volumes = [float(r.find_elements("tag name", "td")[3].get_attribute("data-value"))
               for r in table.find_elements("css selector", "tbody tr")]
    assert volumes == sorted(volumes, reverse=True)
    assert first.find_elements("tag name", "td")[1].text == "Left-Cerebral-White-Matter"
    assert _errors(browser) == []


def test_the_flagged_regions_picture_shows_for_a_planted_defect_not_a_clean_entry(
        browser, report):
    browser.get(report.resolve().as_uri())
    browser.find_element("css selector", "#subjects tr[data-subject='sub-01'] a").click()
    assert _errors(browser) == []
    figure = browser.find_element("id", "picture-label-flags")
    browser.execute_script("arguments[0].scrollIntoView();", figure)
    picture = figure.find_element("tag name", "img")
    assert picture.is_displayed()
    # loaded, not a broken link: the browser decoded the JPEG the report wrote
    assert browser.execute_script(
        "return arguments[0].complete && arguments[0].naturalWidth", picture) > 100
    (entry,) = figure.find_elements("css selector", ".legend [data-code]")
    assert entry.get_attribute("data-code") == "label-side-swap"
    assert int(entry.get_attribute("data-voxels")) > 0 and "voxels flagged" in entry.text
    swatch = entry.find_element("class name", "swatch")
    assert swatch.value_of_css_property("background-color") == "rgba(0, 255, 255, 1)"

    browser.get(report.resolve().as_uri())
    browser.find_element("css selector", "#subjects tr[data-subject='sub-00'] a").click()
    assert _errors(browser) == []
    assert browser.find_elements("id", "picture-label-flags") == []
    assert browser.find_elements("css selector", ".flag-note") == []
