"""The docs' claims, run. Every page (README.md and docs/**/*.md):

- every Python block compiles, and every name a block uses is defined: by the block, by an earlier block of its page,
  by the first program (docs/getting-started.md, which the other pages continue from), or by a `# given: a, b`
  line that says what the reader is assumed to have (ruff's undefined-name check, F821);
- every block marked `<!-- runnable -->` runs, in order, in one namespace per page that starts from the first
  program's, from an empty working directory with the storage root in a temporary folder;
- every page the docs' table of contents does not reach, and every relative link to a file that does not exist, is an
  error (Sphinx's build checks the anchors: `make docs`);
- every public name of the API has a docstring;
- every results table names the revision and the machine it came from (a `Measured:` line);
- the docs speak to users, not to our tracker.
"""

from __future__ import annotations

import glob
import importlib
import inspect
import os
import re
import subprocess
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
MARK = "<!-- runnable -->"
FIRST = "docs/getting-started.md"  # the first program: the other pages continue from its namespace


def pages() -> list[str]:
    """README.md and every Markdown page of docs/, relative to the repository root."""
    found = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)
                   if "_build" not in os.path.relpath(p, DOCS).split(os.sep))
    return ["README.md", *found]


def python_blocks(page: str) -> list[tuple[int, bool, str]]:
    """(line, runnable, code) of every ```python block of `page`."""
    with open(os.path.join(ROOT, page)) as f:
        lines = f.read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            runnable = i > 0 and lines[i - 1].strip() == MARK
            i += 1
            body = []
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            indent = min((len(x) - len(x.lstrip()) for x in body if x.strip()), default=0)
            blocks.append((start + 1, runnable, "\n".join(x[indent:] for x in body)))
        i += 1
    return blocks


def _read(page: str) -> str:
    with open(os.path.join(ROOT, page)) as f:
        return f.read()


@pytest.mark.parametrize("page", pages())
def test_every_python_block_compiles(page):
    for line, _, code in python_blocks(page):
        compile(code, f"{page}:{line}", "exec")


def _given(code: str) -> list[str]:
    return [n.strip() for m in re.finditer(r"^# given: (.+)$", code, flags=re.MULTILINE) for n in m.group(1).split(",")]


def _sources(page: str) -> list[tuple[int, str]]:
    """(line, what ruff reads) per block of `page`: the block after every block before it (the first program's
    blocks first, except on the first program and README.md), each `# given: name` as `name = None`."""
    before = [code for _, _, code in python_blocks(FIRST)] if page not in (FIRST, "README.md") else []
    sources = []
    for line, _, code in python_blocks(page):
        before.append("".join(f"{name} = None\n" for name in _given(code)) + code)
        sources.append((line, "\n\n".join(before)))
    return sources


@pytest.fixture(scope="module")
def undefined_names(tmp_path_factory) -> dict[tuple[str, int], str]:
    """(page, line) -> ruff's F821 findings for that block (as `_sources` gives it to ruff), for every block of every
    page: one ruff process over a file per block rather than one per block."""
    folder = tmp_path_factory.mktemp("blocks")
    files = {}
    for page in pages():
        for line, source in _sources(page):
            path = folder / f"b{len(files):04d}.py"
            path.write_text(source)
            files[str(path)] = (page, line)
    canary = folder / "canary.py"  # ruff reads every file it is given: this one's undefined name must be reported
    canary.write_text("print(no_block_defines_this)\n")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821", "--output-format",
                          "concise", "--no-cache", str(canary), *files], capture_output=True, text=True)
    assert out.returncode == 1 and "error" not in out.stderr.lower(), (out.returncode, out.stderr)
    found: dict[tuple[str, int], str] = {}
    for finding in out.stdout.splitlines():
        path = finding.split(":", 1)[0]
        if path == str(canary):
            found["canary", 0] = finding
        elif path in files:
            found[files[path]] = found.get(files[path], "") + finding.replace(path, "block.py", 1) + "\n"
    assert "no_block_defines_this" in found.get(("canary", 0), ""), out.stdout
    return found


@pytest.mark.parametrize("page", pages())
def test_every_name_a_block_uses_is_defined(page, undefined_names):
    """What a reader copies runs: no block leans on a name that no block before it defines (e.g. an `example_x`)."""
    for line, _ in _sources(page):
        assert (page, line) not in undefined_names, \
            f"{page}:{line}: a name no block defines (say `# given: name`):\n{undefined_names[page, line]}"


def test_the_readme_and_the_first_pages_have_runnable_programs():
    for page, least in (("README.md", 1), (FIRST, 1), ("docs/guides/procedures.md", 2),
                        ("docs/coming-from-ray-tune.md", 1), ("docs/coming-from-optuna.md", 1)):
        runnable = [(line, code) for line, run, code in python_blocks(page) if run]
        assert len(runnable) >= least, f"{page} must mark {least} example(s) runnable"
        for line, code in runnable:
            assert not re.search(r"^\s*\.\.\.\s*$|\(\.\.\.[,)]", code, flags=re.MULTILINE), \
                f"{page}:{line}: a runnable block has a `...` placeholder"


def test_the_readme_is_a_landing_page():
    assert len(_read("README.md").splitlines()) <= 250, "README.md is a landing page: the manual lives in docs/"


def test_every_page_is_in_the_table_of_contents_and_every_relative_link_resolves():
    toc = set()
    for page in pages()[1:]:
        text = _read(page)
        for block in re.findall(r":::\{toctree\}(.*?):::", text, flags=re.DOTALL):
            for entry in block.splitlines():
                entry = entry.strip()
                if entry and not entry.startswith(":"):
                    toc.add(os.path.normpath(os.path.join(os.path.dirname(page), entry + ".md")))
    unreached = [p for p in pages()[1:] if p not in toc and p != "docs/index.md"]
    assert not unreached, f"pages no table of contents lists: {unreached}"
    for page in pages():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _read(page)):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target))
            assert os.path.exists(path), f"{page}: the link to {target} leads nowhere"


def test_the_docs_do_not_speak_of_issues_or_notes():
    for page in pages():
        text = _read(page).lower()
        for phrase in ("the issue", "closing note", "issue that asked"):
            assert phrase not in text, f"{page}: {phrase}"


def test_claims_a_new_user_found_wrong_stay_corrected():
    """Each of these was in the docs and did not hold (the demo takes 15-25 s, mostly Ray's start; the live Ray
    backend runs gangs; a procedure's cut configs are `pruned` only when its decision says so)."""
    everything = "\n".join(_read(p) for p in pages())
    assert "in a few seconds" not in everything
    assert "refuse gangs" not in everything
    procedures = _read("docs/guides/procedures.md")
    assert "pruned=" in procedures, "the custom procedure must show Decision.pruned, or its cut configs say completed"


def _has_output_block(text: str) -> bool:
    """Whether `text` has a fenced block opened without a language (an experiment's printed output)."""
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            if not inside and line.strip() == "```":
                return True
            inside = not inside
    return False


MEASURED = re.compile(r"^\*?Measured: .*revision `([0-9a-f]{7,40})`.* on (.+)$", flags=re.MULTILINE)


def test_every_results_table_says_where_it_came_from():
    """A page that names an experiment script and shows a table or an output block has a `Measured:` line naming a
    revision of this repository and the machine (the experiments' index and the GPU guide's commands excepted)."""
    for page in pages():
        text = _read(page)
        shows = re.search(r"^\|---", text, flags=re.MULTILINE) or _has_output_block(text)
        if not re.search(r"experiments/\w+\.py", text) or not shows or page in ("docs/research/experiments.md",
                                                                                  "docs/guides/gpus.md"):
            continue
        found = MEASURED.findall(text)
        assert found, f"{page} shows experiments' results without a `Measured: ... revision `abc1234` ... on` line"
        for revision, machine in found:
            known = subprocess.run(["git", "-C", ROOT, "cat-file", "-e", f"{revision}^{{commit}}"],
                                   capture_output=True)
            assert known.returncode == 0 or not os.path.isdir(os.path.join(ROOT, ".git")), \
                f"{page}: revision {revision} is not a commit of this repository"
            assert machine.strip(), page


API = ("framework", "automl", "simulators", "framework.runs", "framework.examples", "framework.stoppers")


def _public(module: types.ModuleType) -> list[str]:
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [n for n, o in vars(module).items() if not n.startswith("_")
            and (inspect.isfunction(o) or inspect.isclass(o)) and o.__module__ == module.__name__]


def test_every_public_name_has_a_docstring():
    missing = []
    for name in API:
        module = importlib.import_module(name)
        assert inspect.getdoc(module), name
        for attr in _public(module):
            obj = getattr(module, attr)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not inspect.getdoc(obj):
                missing.append(f"{name}.{attr}")
            if inspect.isclass(obj):
                for member, value in vars(obj).items():
                    fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                    if not member.startswith("_") and inspect.isfunction(fn) and not inspect.getdoc(fn) \
                            and not inspect.getdoc(getattr(obj, member)):
                        missing.append(f"{name}.{attr}.{member}")
    assert not missing, f"public names without a docstring: {missing}"


@pytest.mark.ray
def test_runnable_blocks_run(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MODELHOPPER_STORAGE", str(tmp_path / "runs"))
    os.makedirs(tmp_path / "work", exist_ok=True)
    monkeypatch.chdir(tmp_path / "work")

    def run_page(page: str, start: dict) -> dict:
        # importable while it runs, as a user's script is (a define-by-run space pickles with the run), and its
        # functions go to the workers by value, as a script's do
        module = types.ModuleType("docs_" + re.sub(r"\W", "_", page))
        module.__dict__.update({k: v for k, v in start.items() if not k.startswith("__")})
        monkeypatch.setitem(sys.modules, module.__name__, module)
        ray_cluster.cloudpickle.register_pickle_by_value(module)
        for line, run, code in python_blocks(page):
            if run:
                exec(compile(code, f"{page}:{line}", "exec"), module.__dict__)  # noqa: S102 - our own docs
        return module.__dict__

    first = run_page(FIRST, {})
    ran_first = [code for _, run, code in python_blocks(FIRST) if run]
    for page in pages():
        runnable = [code for _, run, code in python_blocks(page) if run]
        if page == FIRST or not runnable:
            continue
        if page == "README.md" and runnable == ran_first:
            continue  # the first program, character for character, from the same empty namespace: it just ran
        run_page(page, {} if page == "README.md" else first)
    assert os.listdir(tmp_path / "work") == [], "a docs example wrote into the working directory"
    assert os.listdir(tmp_path / "runs"), "the docs' runs went nowhere under $MODELHOPPER_STORAGE"


def _tree_section(lines: list[str], path: str) -> list[str]:
    """The lines of the layout page's tree under the entry for folder `path` ("framework/scheduling"): its own
    line and every following line indented deeper."""
    at = 0
    for part in path.split("/"):
        indent = None
        for i in range(at, len(lines)):
            m = re.match(rf"^( *){re.escape(part)}/ ", lines[i])
            if m and (indent is None or len(m.group(1)) >= indent):
                indent, at = len(m.group(1)), i
                break
        else:
            raise AssertionError(f"docs/contributing/layout.md's tree has no entry for {path}/")
    indent = len(lines[at]) - len(lines[at].lstrip())
    end = next((j for j in range(at + 1, len(lines)) if len(lines[j]) - len(lines[j].lstrip()) <= indent), len(lines))
    return lines[at:end]


def test_the_layout_page_names_every_module_in_its_folder():
    with open(os.path.join(ROOT, "docs", "contributing", "layout.md")) as f:
        text = f.read()
    tree = text[text.index("```\nframework/") + 4:]
    lines = tree[:tree.index("```")].splitlines()
    missing = []
    for package in ("framework", "automl", "simulators"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
            rel = os.path.relpath(folder, ROOT)
            section = "\n".join(_tree_section(lines, rel))
            missing += [f"{rel}/{f}" for f in sorted(files) if f.endswith(".py") and f != "__init__.py"
                        and not re.search(rf"(?<![\w.]){re.escape(f)}", section)]
    assert not missing, f"docs/contributing/layout.md does not name {missing} under their folders"


#: a dotted name of ours in a page's text or code: `framework.store.catalog`, `framework.Result.open`, ...
_DOTTED = re.compile(r"(?<![\w./-])((?:framework|automl|simulators)(?:\.[A-Za-z_]\w*)+)")


def _resolves(dotted: str) -> bool:
    """Whether `dotted` names something: its longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _names_used(text: str) -> set[str]:
    """The dotted names of ours a page uses: in its text, and what its code imports (`from X import a, b`)."""
    names = {n for n in _DOTTED.findall(text) if n.rsplit(".", 1)[1] not in ("md", "py", "html", "txt", "toml")}
    for m in re.finditer(r"^\s*from ((?:framework|automl|simulators)[\w.]*) import (?:\(([^)]*)\)|([\w, ]+)$)", text,
                         re.MULTILINE):
        imported = (m.group(2) or m.group(3)).replace("\n", " ")
        names |= {f"{m.group(1)}.{n.split(' as ')[0].strip()}" for n in imported.split(",") if n.strip()}
    return names


def test_every_name_of_ours_a_page_uses_resolves():
    """Every `framework....`, `automl....` or `simulators....` name the README and the docs' pages mention or
    import still names a module, class, function or attribute: a module moved or a name renamed shows here."""
    missing = {}
    for page in pages():
        bad = sorted(n for n in _names_used(_read(page)) if not _resolves(n))
        if bad:
            missing[page] = bad
    assert not missing, f"names the docs use that do not resolve: {missing}"
