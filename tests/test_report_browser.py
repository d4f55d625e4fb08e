"""report.html in headless Chromium: no console errors, no failed request, every image decoded; a screenshot for eyes.

Debian's chromium (``apt-get install chromium``; ``.ci/run`` installs it) driven by playwright's Python API. The
page must be self-contained, so network access is refused outright and any request other than the file itself or
a data URI fails the test.
"""

from contextlib import contextmanager
from pathlib import Path

import pytest
from report_fixture import build_sweep

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(apt-get install -y chromium; .ci/run does this)"),
]


@contextmanager
def opened(page_file: Path, profile: Path, errors: list, requests: list):
    """``page_file`` loaded in headless chromium; console errors and every requested URL appended to the lists."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("request", lambda request: requests.append(request.url))
            page.goto(page_file.as_uri(), wait_until="load")
            yield page
        finally:
            context.close()


def test_report_html_renders_without_errors_and_all_images_load(tmp_path):
    from harness.report.leaderboard import write_leaderboard

    resolved, paths = build_sweep(tmp_path)
    write_leaderboard(resolved, paths, n_resamples=300)
    page_file = paths.root / "report.html"

    errors, requests = [], []
    with opened(page_file, tmp_path / "chromium-profile", errors, requests) as page:
        images = page.eval_on_selector_all(
            "img", "imgs => imgs.map(i => ({src: i.src.slice(0, 30), complete: i.complete, "
                   "width: i.naturalWidth}))")
        tables = page.locator("table").count()
        highlighted = page.locator(".tokens .tok[title*='weight']").count()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)

    assert errors == []
    assert len(images) >= 4
    assert all(img["complete"] and img["width"] > 0 for img in images), images
    assert all(img["src"].startswith("data:image/png;base64,") for img in images)
    assert [url for url in requests if not url.startswith(("file:", "data:"))] == []
    assert tables >= 5 and highlighted > 0


def test_summary_html_renders_with_its_forest_plot_visible(tmp_path):
    """``harness summarize``'s page: no console error, nothing fetched, the forest plot decoded and on screen."""
    import shutil

    from harness.report.across_sweeps import write_summary

    example = Path(__file__).resolve().parent.parent / "results" / "example"
    folder = shutil.copytree(example, tmp_path / "example",
                             ignore=shutil.ignore_patterns("figures", "report.html", "metrics.jsonl"))
    write_summary([Path(folder)], tmp_path / "summary")
    page_file = tmp_path / "summary" / "summary.html"

    errors, requests = [], []
    with opened(page_file, tmp_path / "chromium-profile", errors, requests) as page:
        figure = page.locator("#forest ~ figure img")
        figure.scroll_into_view_if_needed()
        decoded = figure.evaluate("img => ({complete: img.complete, width: img.naturalWidth, "
                                  "src: img.src.slice(0, 30)})")
        box = figure.bounding_box()
        visible = figure.is_visible()
        rows = page.locator("#forest ~ div.scroll").first.locator("tbody tr").count()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "summary.png"), full_page=True)

    assert errors == []
    assert [url for url in requests if not url.startswith(("file:", "data:"))] == []
    assert decoded["complete"] and decoded["width"] > 0 and decoded["src"].startswith("data:image/png;base64,")
    assert visible and box["width"] > 300 and box["height"] > 100
    assert rows == 7  # the table under the figure: one row per label of the example against its baseline
