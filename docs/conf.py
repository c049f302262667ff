"""Sphinx configuration of the modelhopper docs: Markdown pages (MyST), the PyData theme, an API reference from the
docstrings. `make docs` builds it offline with warnings as errors (no intersphinx, nothing fetched)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

project = "modelhopper"
author = "the modelhopper authors"
copyright = "2026, the modelhopper authors"  # noqa: A001 - Sphinx's name
try:
    release = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True,
                             check=True).stdout.strip()
except (OSError, subprocess.CalledProcessError):
    release = "unknown"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
suppress_warnings = ["myst.xref_ambiguous", "ref.python"]  # a name two classes share (`metric`)

html_theme = "pydata_sphinx_theme"
html_title = "modelhopper"
html_static_path: list[str] = []
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2, "secondary_sidebar_items": ["page-toc"],
                      "footer_start": ["copyright"], "footer_end": []}
html_show_sourcelink = False
napoleon_use_ivar = True
