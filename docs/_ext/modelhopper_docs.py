"""The docs build's own Sphinx extension (docs/conf.py loads it).

- The examples gallery's pages (sphinx-gallery, from examples/*.py): an example's docstring is Markdown, as the
  rest of the docs, and its first sentence has no reST underline. Each generated page gets a title (the first
  sentence up to its colon) and its docstring is parsed as MyST Markdown (the `mh-markdown` directive), so
  `code`, indented command lines and tables read as they do in the file. The note above the title that points to
  the download links at the end is left out, and the program comes before its output.
- `example_argv`: an example runs as `python examples/NAME.py` would: no arguments, and its `__doc__` set.
- `mh-code`, the default role (the docstrings' `name`): code, linked where it names an object of the API.
- `learning_curves_scraper`: a sphinx-gallery image scraper that shows the `learning_curves.png` of every run an
  example made (the runs close their matplotlib figures, so the default scraper finds none).
"""

from __future__ import annotations

import ast
import glob
import os
import re
import shutil
import textwrap

from docutils import nodes
from docutils.utils import new_document, unescape
from sphinx.util.docutils import SphinxDirective

GALLERY = "examples"  # conf.py's sphinx_gallery_conf["gallery_dirs"]
_LABEL = re.compile(r"^\.\. _sphx_glr_(\S+)\.py:\n", flags=re.MULTILINE)
_END = ".. GENERATED FROM PYTHON SOURCE LINES"
_NOTE = re.compile(r"^\.\. only:: html\n\n    \.\. note::\n        :class: sphx-glr-download-link-note\n.*?(?=^\S)",
                   flags=re.MULTILINE | re.DOTALL)  # "Go to the end to download": the links are at the end anyway
_SEEN: set[str] = set()  # the learning curves shown already (or there before the build)


def _runs_root() -> str:
    return os.environ.get("MODELHOPPER_STORAGE", "")


def _curves() -> set[str]:
    root = _runs_root()
    return set(glob.glob(os.path.join(glob.escape(root), "**", "learning_curves.png"), recursive=True)) if root else set()


def learning_curves_scraper(block, block_vars, gallery_conf):
    """The learning curves of the runs the code block just made, as sphinx-gallery figures."""
    from sphinx_gallery.scrapers import figure_rst

    new = sorted(_curves() - _SEEN)
    _SEEN.update(new)
    images = []
    for path, target in zip(new, block_vars["image_path_iterator"]):
        shutil.copyfile(path, target)
        images.append(target)
    return figure_rst(images, gallery_conf["src_dir"])


def example_argv(gallery_conf, script_vars):
    """sphinx-gallery's `reset_argv`: an example runs without arguments, as `python examples/NAME.py` does, and with
    its module docstring as `__doc__` (sphinx-gallery blanks it; the examples' argparse help reads it)."""
    with open(script_vars["src_file"], encoding="utf-8") as f:
        script_vars["example_globals"]["__doc__"] = ast.get_docstring(ast.parse(f.read()), clean=False)
    return []


def _title_and_lead(first: str) -> tuple[str, str]:
    """An example's first docstring paragraph as a title and the sentence that follows it."""
    sentence = " ".join(first.split())
    head, colon, rest = sentence.partition(": ")
    if colon:
        return head, rest[:1].upper() + rest[1:]
    return sentence.rstrip("."), ""


def gallery_page(text: str) -> str:
    """A generated example page with a title and its docstring as Markdown (unchanged when it has neither)."""
    label = _LABEL.search(text)
    end = text.find(_END, label.end()) if label else -1
    if end < 0:
        return text
    docstring = text[label.end():end].strip("\n")
    first, _, rest = docstring.partition("\n\n")
    title, lead = _title_and_lead(first)
    body = "\n\n".join(p for p in (lead, rest.strip("\n")) if p)
    page = f"{title}\n{'=' * len(title)}\n\n"
    if body:
        page += ".. mh-markdown::\n\n" + textwrap.indent(body, "   ", lambda line: True) + "\n\n"
    return _NOTE.sub("", text[:label.end()], count=1) + "\n" + page + _code_first(text[end:])


def _code_first(rest: str) -> str:
    """The program, then what it printed and drew (sphinx-gallery puts a one-block example's output first)."""
    code = rest.find("\n.. code-block:: Python")
    stop = rest.find("\n.. rst-class:: sphx-glr-timing")
    head = rest.find("\n", 1)  # after the `.. GENERATED FROM PYTHON SOURCE LINES` line
    if not 0 < head < code < stop:
        return rest
    output = rest[head:code].rstrip()
    output = output[:-1].rstrip() if output.endswith("\n|") else output  # the spacer it puts before the code
    return rest[:head] + "\n" + rest[code:stop] + "\n" + output + "\n\n" + rest[stop:]


_NAME = re.compile(r"[A-Za-z_][\w.]*(\(\))?")


def docstring_code(name, rawtext, text, lineno, inliner, options=None, content=None):
    """The docstrings' default role: `text` is code, as in the Markdown pages, and a link where it is a name the API
    documents (`framework.Result`), through the Python domain's `py:obj`. Anything else (`~/modelhopper_runs`,
    `<run>-<timestamp>`) stays literal text, which `py:obj` would read as its own syntax."""
    if _NAME.fullmatch(text):
        role = inliner.document.settings.env.get_domain("py").role("obj")
        return role("py:obj", rawtext, text, lineno, inliner, options or {}, content or [])
    return [nodes.literal(rawtext, unescape(text))], []


class MarkdownBlock(SphinxDirective):
    """`.. mh-markdown::` in a reST page: its content parsed as MyST Markdown."""

    has_content = True

    def run(self):
        from myst_parser.parsers.sphinx_ import MystParser

        document = new_document(self.env.doc2path(self.env.docname, False), self.state.document.settings)
        MystParser().parse("\n".join(self.content) + "\n", document)
        return document.children


def _source_read(app, docname, source):
    if docname.startswith(GALLERY + "/") and docname != GALLERY + "/index":
        source[0] = gallery_page(source[0])


def _builder_inited(app):
    _SEEN.update(_curves())


def setup(app):
    app.add_role("mh-code", docstring_code)
    app.add_directive("mh-markdown", MarkdownBlock)
    app.connect("source-read", _source_read)
    app.connect("builder-inited", _builder_inited, priority=100)  # before the gallery runs
    return {"parallel_read_safe": True, "parallel_write_safe": True}
