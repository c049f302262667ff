"""The docs site as a reader sees it: built with Sphinx (warnings are errors), then rendered in headless Chromium at
1280 x 1000. On the landing page, a guide and an API object's page:

- the primary sidebar holds the site's tree (more than 10 links), not an empty column;
- no code block and no table is wider than its column (no sideways scrolling);
- a code block whose lines are at most 120 characters (the code's width, pyproject.toml's line-length) fits without
  wrapping: the column is wide enough, the wrap is only the fallback for longer printed output;
- at 1280 px the page's own contents are a drawer behind a header button (from 1600 px, a column);
- every public class and function of the API has a page, listed on one of the topic pages (docs/api/*.md);
- the API shows a default's value (`num_workers=None`), not the expression that computes it (`_D.num_workers`).

The build runs the examples gallery's pages without running the examples (MODELHOPPER_DOCS_RUN_EXAMPLES=0, read by
docs/conf.py; `make docs` runs them). A screenshot of each page goes to $MODELHOPPER_SCREENSHOT_DIR, else build/.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1280, 1000
CODE_COLUMNS = 120

#: name -> page of the built site
PAGES = {
    "landing": "index.html",
    "guide": "guides/data.html",
    "api": "api/generated/framework.ModelSelection.html",
}

# for every `pre` and every table (and the theme's wrapper around it): its widths, its longest line, and whether
# that line fits unwrapped (`white-space: pre` for the measurement); the primary sidebar's links
MEASURE = """
const rows = [];
for (const pre of document.querySelectorAll('.bd-article pre')) {
  const longest = Math.max(0, ...pre.textContent.replace(/\\n$/, '').split('\\n').map(line => line.length));
  const wrap = pre.style.whiteSpace;
  pre.style.whiteSpace = 'pre';
  const unwrapped = pre.scrollWidth;
  pre.style.whiteSpace = wrap;
  rows.push({kind: 'pre', longest, client: pre.clientWidth, scroll: pre.scrollWidth, unwrapped,
             text: pre.textContent.slice(0, 80)});
}
for (const box of document.querySelectorAll('.bd-article .pst-scrollable-table-container, .bd-article table')) {
  rows.push({kind: box.tagName.toLowerCase(), client: box.clientWidth, scroll: box.scrollWidth,
             text: box.textContent.trim().slice(0, 80)});
}
const article = document.querySelector('.bd-article-container');
return {rows, links: document.querySelectorAll('.bd-sidebar-primary nav a[href]').length,
        article: article ? Math.round(article.getBoundingClientRect().width) : null,
        width: window.innerWidth};
"""


API = ("framework", "automl", "simulators", "framework.runs", "framework.examples", "framework.stoppers")


def _documented() -> set[str]:
    """`module.Name` of every entry of the autosummary tables on docs/api/*.md (their pages are generated from them)."""
    found = set()
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        module, in_table = None, False
        for line in page.read_text(encoding="utf-8").splitlines():
            text = line.strip()
            if text.startswith(".. currentmodule::"):
                module = text.split("::", 1)[1].strip()
            elif text.startswith(".. autosummary::"):
                in_table = True
            elif in_table and (not text or text.startswith(":")):
                continue
            elif in_table and line.startswith("   ") and not text.startswith(".."):
                found.add(f"{module}.{text.lstrip('~')}")
            else:
                in_table = False
    return found


def test_every_public_class_and_function_has_a_page_in_the_api_reference():
    public = set()
    for name in API:
        module = importlib.import_module(name)
        names = getattr(module, "__all__", None) or [
            n for n, o in vars(module).items()
            if not n.startswith("_") and (inspect.isfunction(o) or inspect.isclass(o)) and o.__module__ == name]
        public |= {f"{name}.{n}" for n in names
                   if inspect.isclass(getattr(module, n)) or inspect.isfunction(getattr(module, n))}
    documented = _documented()
    assert not public - documented, f"list them in an autosummary table of docs/api/*.md: {sorted(public - documented)}"
    assert not documented - public, f"docs/api/*.md lists names that are not public: {sorted(documented - public)}"


def _missing_docs_tools() -> list[str]:
    return [name for name in ("sphinx", "myst_parser", "pydata_sphinx_theme", "sphinx_gallery")
            if importlib.util.find_spec(name) is None]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built into a temporary folder as `make docs` builds it, less running the examples."""
    missing = _missing_docs_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install -e '.[docs]' (make docs does)")
    out = tmp_path_factory.mktemp("docs-site")
    env = {**os.environ, "MODELHOPPER_DOCS_RUN_EXAMPLES": "0"}
    done = subprocess.run([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html",
                           "-d", str(out / "doctrees"), str(ROOT / "docs"), str(out / "html")],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"the docs build failed (warnings are errors):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return out / "html"


def _chrome(headless_chrome):
    """A headless Chromium whose viewport is exactly WIDTH x HEIGHT, each page a first visit."""
    driver = headless_chrome(WIDTH, HEIGHT)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
    # every page as a first visit: the theme keeps the sidebar's scroll from page to page in sessionStorage
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                           {"source": "sessionStorage.removeItem('sidebar-scroll-top');"})
    return driver


@pytest.fixture(scope="module")
def browser(headless_chrome):
    driver = _chrome(headless_chrome)
    yield driver
    driver.quit()


def _screenshot(driver, name: str) -> Path:
    folder = Path(os.environ.get("MODELHOPPER_SCREENSHOT_DIR") or ROOT / "build")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"docs-{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot written to {path}"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return path


@pytest.mark.slow  # a whole build of the site: make test-slow (CI)
@pytest.mark.parametrize("name", sorted(PAGES))
def test_a_page_has_the_site_tree_and_nothing_scrolls_sideways(site, browser, name):
    page = site / PAGES[name]
    assert page.is_file(), f"the build wrote no {PAGES[name]}"
    browser.get(page.as_uri())
    measured = browser.execute_script(MEASURE)
    _screenshot(browser, name)
    assert measured["width"] == WIDTH, measured
    assert measured["links"] > 10, f"{PAGES[name]}: the primary sidebar has {measured['links']} links, not the site"
    rows = measured["rows"]
    if name == "guide":
        assert any(r["kind"] == "pre" for r in rows) and any(r["kind"] == "table" for r in rows), \
            f"{PAGES[name]} no longer has a code block and a table to measure: pick another guide"
    wider = [r for r in rows if r["scroll"] > r["client"] + 1]
    assert not wider, f"{PAGES[name]} at {WIDTH} px: wider than their column (scrolls sideways): {wider}"
    wrapped = [r for r in rows if r["kind"] == "pre" and r["longest"] <= CODE_COLUMNS and r["unwrapped"] > r["client"] + 1]
    assert not wrapped, f"{PAGES[name]} at {WIDTH} px: code of at most {CODE_COLUMNS} columns does not fit: {wrapped}"


@pytest.mark.slow  # a whole build of the site: make test-slow (CI)
def test_the_page_contents_open_from_the_header_where_their_column_would_narrow_the_article(site, browser):
    """At 1280 px the page's own contents ("On this page") are a drawer behind the header's button, not a column."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get((site / PAGES["guide"]).as_uri())
    assert not browser.find_element(By.ID, "pst-secondary-sidebar").is_displayed()
    browser.find_element(By.CSS_SELECTOR, ".bd-header button.secondary-toggle").click()
    drawer = browser.find_element(By.ID, "pst-secondary-sidebar-modal")
    WebDriverWait(browser, 10).until(lambda _: drawer.get_attribute("open") is not None)
    assert len(drawer.find_elements(By.CSS_SELECTOR, "a[href^='#']")) >= 2, "the drawer lacks the page's sections"


@pytest.mark.slow  # a whole build of the site: make test-slow (CI)
def test_the_api_shows_default_values_not_the_expressions_that_compute_them(site):
    text = re.sub(r"<[^>]+>", "", (site / PAGES["api"]).read_text(encoding="utf-8"))
    assert "_D." not in text, "a signature shows `_D.<option>`: autodoc_preserve_defaults is on again"
    for default in ("num_workers=None", "scheduler='randomized'", "seed=0"):
        assert default in text, f"ModelSelection's signature lacks {default}"
