"""Sphinx configuration of the modelhopper docs: Markdown pages (MyST), the PyData theme, an API reference with a page
per public class and function (autosummary), and a gallery of examples/*.py, run while the site builds
(sphinx-gallery). `make docs` builds it offline with warnings as errors (no intersphinx, nothing fetched).

MODELHOPPER_DOCS_RUN_EXAMPLES=0 builds the gallery's pages without running the examples (tests/test_docs_site.py
does, to stay fast); `make docs` runs them."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "docs", "_ext"))

# The examples start a local Ray of their own and write their runs under $MODELHOPPER_STORAGE: a temporary folder of
# this build's, removed when it ends (never the repository, nor the runs `modelhopper list` shows). No cluster
# (RAY_ADDRESS) and no usage report: the build runs offline.
RUNS = tempfile.mkdtemp(prefix="modelhopper-docs-runs-")
atexit.register(shutil.rmtree, RUNS, ignore_errors=True)
os.environ["MODELHOPPER_STORAGE"] = RUNS
os.environ.pop("RAY_ADDRESS", None)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
RUN_EXAMPLES = os.environ.get("MODELHOPPER_DOCS_RUN_EXAMPLES", "1") not in ("0", "false", "no", "")

project = "modelhopper"
author = "the modelhopper authors"
copyright = "2026, the modelhopper authors"  # noqa: A001 - Sphinx's name
try:
    release = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True,
                             check=True).stdout.strip()
except (OSError, subprocess.CalledProcessError):
    release = "unknown"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon",
              "sphinx.ext.viewcode", "sphinx_gallery.gen_gallery", "modelhopper_docs"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}  # .rst: autosummary's and the gallery's pages
exclude_patterns = ["_build", "_templates", "Thumbs.db", ".DS_Store"]
templates_path = ["_templates"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# the API reference: a page per public object (docs/api/generated/, written by the build), grouped on docs/api/*.md
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# a signature shows a default's value (`num_workers=None`), not the expression that computes it (`_D.num_workers`)
autodoc_preserve_defaults = False
# a docstring's `name` is code, linked where it names an object of the API (the docstrings are written that way)
default_role = "mh-code"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
suppress_warnings = ["myst.xref_ambiguous", "ref.python"]  # a name two classes share (`metric`)


# the examples gallery: docs/examples/ (written by the build) from examples/*.py, each run and its output shown
sphinx_gallery_conf = {
    "examples_dirs": [os.path.join(ROOT, "examples")],
    "gallery_dirs": ["examples"],
    "filename_pattern": r"\.py$",  # run every example, not only plot_*.py
    "ignore_pattern": r"__init__\.py",
    "plot_gallery": RUN_EXAMPLES,
    "run_stale_examples": RUN_EXAMPLES,  # run them every time: the framework may have changed, not only the example
    "image_scrapers": ("matplotlib", "modelhopper_docs.learning_curves_scraper"),
    "reset_argv": "modelhopper_docs.example_argv",
    "download_all_examples": False,
    "remove_config_comments": True,
    "min_reported_time": 0,
    "show_memory": False,
    "show_signature": False,
    "write_computation_times": False,
    "abort_on_example_error": True,
}

html_theme = "pydata_sphinx_theme"
html_title = "modelhopper"
html_static_path = ["_static"]
html_css_files = ["modelhopper.css"]
# the primary sidebar: the whole site tree (index.md's toctrees) on every page, with the current page opened
html_sidebars = {"**": ["site-nav"]}
html_theme_options = {
    "navigation_with_keys": False,
    "navbar_center": [],  # the sidebar is the site's map; the header keeps the title, search and the theme switch
    "show_nav_level": 2,  # the sections and their pages open; an API topic's objects open on its pages
    "navigation_depth": 3,
    "collapse_navigation": False,
    "primary_sidebar_end": [],
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_show_sourcelink = False
