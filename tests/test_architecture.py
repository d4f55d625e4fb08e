"""Import contracts and self-contained documentation, checked on the source with ``ast`` (nothing is imported).

- only the TRL boundary, harness/train/trl/, imports ``trl`` (in harness/, methods/, bench/ and studies/);
- the actor (harness/train/actor.py) and what it reads of a step import neither TRL, accelerate, transformers'
  Trainer nor the boundary;
- methods/ never imports ``harness``;
- harness/ packages import one way, config -> data -> model -> train -> evaluation -> ops -> report -> cli: no
  module imports a package later in that order, also not inside a function;
- no import cycle between the modules of harness/ (lazy imports inside functions count: they only hide a cycle);
- every repository path named in a docstring or comment of harness/, methods/, Snakefile and tests/ exists;
- every repository path and every link target in the hand-written Markdown (all but results/) exists inside the
  repository.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

import pytest

from harness.config.paths import REPO_ROOT

LAYERS = ("config", "data", "model", "train", "evaluation", "ops", "report", "cli")
TRL_PACKAGE = "harness.train.trl"  # the TRL boundary; TRL's private methods change between releases
# the policy update without TRL: testable without a GRPOTrainer, readable without TRL's internals
TRL_FREE_MODULES = ("harness.train.actor", "harness.train.step_batch", "harness.train.budget",
                    "harness.train.hooks", "harness.train.loss", "harness.train.row_chunks",
                    "harness.train.token_statistics", "harness.train.sample_batch", "harness.train.dynamic_sampling")

# TEMPORARY exceptions to the contracts, each with its reason: code owned by other work in progress. Remove an entry
# once its code is fixed (the tests below fail on an entry that is no longer needed, so the list only shrinks).
TRL_EXCEPTIONS: dict[str, str] = {}  # bench/ reaches TRL through harness.train.trl.bench_probes
LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {}  # provenance takes data checksums computed by the caller
CYCLE_EXCEPTIONS: dict[frozenset[str], str] = {}


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO_ROOT / folder).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path) -> set[str]:
    """Every module named by an import statement anywhere in the file (functions included); ``from a import b``
    gives ``a.b`` (b may be a module) and ``a``; relative imports are resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


HARNESS_MODULES = {module_name(p): p for p in python_files("harness")}


def harness_imports(path: Path) -> set[str]:
    """The harness modules ``path`` imports (a name that is not a module, ``from m import f``, counts as m)."""
    out = set()
    for name in imported_names(path):
        while name and name not in HARNESS_MODULES:
            name = name.rpartition(".")[0]
        if name and name != "harness":
            out.add(name)
    return out - {module_name(path)}


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_only_the_trl_boundary_imports_trl():
    importers = {module_name(p) for p in python_files("harness", "methods", "bench", "studies")
                 if any(n == "trl" or n.startswith("trl.") for n in imported_names(p))}
    assert f"{TRL_PACKAGE}.trainer" in importers  # the check sees an import where there is one
    assert {m for m in importers if not m.startswith(TRL_PACKAGE)} == set(TRL_EXCEPTIONS)


def test_the_actor_imports_no_trainer_framework():
    # transformers' models and attention functions are fine (token statistics run the model); its Trainer is not
    frameworks = ("trl", "accelerate", "transformers.trainer", TRL_PACKAGE)
    offenders = {module: sorted(n for n in imported_names(HARNESS_MODULES[module])
                                if any(n.lower() == f or n.lower().startswith(f"{f}") for f in frameworks))
                 for module in TRL_FREE_MODULES}
    assert {m: names for m, names in offenders.items() if names} == {}


def test_methods_never_import_harness():
    offenders = {module_name(p): sorted(n for n in imported_names(p) if n == "harness" or n.startswith("harness."))
                 for p in python_files("methods")}
    assert {m: names for m, names in offenders.items() if names} == {}


def test_every_harness_module_belongs_to_a_layer():
    assert {m for m in HARNESS_MODULES if m != "harness" and layer(m) is None} == set()


def test_harness_layers_import_one_way():
    upward = {(module, target) for module, path in HARNESS_MODULES.items() for target in harness_imports(path)
              if layer(module) is not None and layer(target) is not None and layer(target) > layer(module)}
    assert upward == set(LAYER_EXCEPTIONS), f"a lower layer imports a higher one (order: {' -> '.join(LAYERS)})"


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_find_cycles_sees_a_cycle_and_only_cycles():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_cycle_between_harness_modules():
    graph = {module: harness_imports(path) for module, path in HARNESS_MODULES.items()}
    assert {frozenset(c) for c in find_cycles(graph)} == set(CYCLE_EXCEPTIONS)


# --- paths named in docstrings and comments -----------------------------------------------------------------------

PATH_TOKEN = re.compile(r"(?<![\w./-])[\w./-]*\w\.(?:py|md|yaml|sh)\b")
TOP_LEVEL = {p.name for p in REPO_ROOT.iterdir()} | {"docs", "results", "data", "bench", "studies"}
# A token counts as a repository path when it starts at a top-level entry of the repository (harness/, configs/,
# docs/...) or is an upper-case document name (README.md); paths inside other repositories that docstrings cite
# (verl/trainer/ppo/core_algos.py, trl/trainer/grpo_trainer.py) start elsewhere and are not checked.
DOC_NAME = re.compile(r"[A-Z][A-Z_]*\.md")


def documentation_text(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file or the Snakefile."""
    source = path.read_text(encoding="utf-8")
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    if path.suffix == ".py":  # docstrings of modules, classes, functions and fields: string statements
        out += [(node.lineno, node.value.value) for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)]
    else:  # the Snakefile is not plain Python: its docstring is its first string
        first = next(tok for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                     if tok.type == tokenize.STRING)
        out.append((first.start[0], first.string))
    return out


def named_paths(text: str) -> list[str]:
    out = []
    for token in PATH_TOKEN.findall(text):
        token = token.rstrip(".")
        if token.split("/")[0] in TOP_LEVEL and "/" in token or DOC_NAME.fullmatch(token):
            out.append(token)
    return out


DOCUMENTED_FILES = [*python_files("harness", "methods", "bench", "studies", "tests"), REPO_ROOT / "Snakefile"]


@pytest.mark.parametrize("path", DOCUMENTED_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_paths_named_in_docstrings_and_comments_exist(path):
    missing = [f"line {line}: {name}" for line, text in documentation_text(path) for name in named_paths(text)
               if not (REPO_ROOT / name).exists()]
    assert missing == []


def test_the_path_check_finds_repository_paths_only():
    text = "see harness/train/budget.py, README.md and verl/trainer/ppo/core_algos.py; results/<sweep>/sweep.yaml"
    assert named_paths(text) == ["harness/train/budget.py", "README.md"]
    assert named_paths("configs/method/nosuch.yaml, METHODS.md") == ["configs/method/nosuch.yaml", "METHODS.md"]


# --- paths and links in the Markdown documents --------------------------------------------------------------------

# Hand-written documents only: under results/ the Markdown (leaderboards, the benchmark summary) is generated.
MARKDOWN_SKIPPED_TOP_LEVEL = {"results"}
REPOSITORY_ENTRIES = {p.name for p in REPO_ROOT.iterdir() if not p.name.startswith(".")
                      and not p.name.endswith(".egg-info")}
# results/<sweep>/ is a sweep's output and never tracked (.gitignore); only these folders of results/ are.
TRACKED_RESULTS = {"bench", "example"}
# Files of other repositories that a document names by their own path, which starts like one of ours.
OTHER_REPOSITORIES_PATHS = {
    ("data/README.md", "data/math_oai/test.jsonl"): "ZubinGou/math-evaluation-harness's copy of MATH-500",
    ("data/README.md", "data/dapo-math-17k.parquet"): "the file of the DAPO-Math-17k dataset repository on the hub",
}
PATHLIKE = re.compile(r"[\w./<>{}*$~@-]+")
PLACEHOLDER = re.compile(r"[<>{}*$~@]")  # results/<sweep>/, logs/{rule}.log, configs/sweeps/paper-*.yaml
MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)[^)]*\)")
URL_SCHEME = re.compile(r"[a-z][a-z+.-]*:")


def markdown_files() -> list[Path]:
    tops = [p for p in REPO_ROOT.iterdir() if p.name in REPOSITORY_ENTRIES - MARKDOWN_SKIPPED_TOP_LEVEL]
    return sorted(f for top in tops for f in ([top] if top.is_file() else top.rglob("*.md")) if f.suffix == ".md")


def markdown_paths(text: str) -> list[str]:
    """Every token of `text` that names a file of the repository: a path from the repository root (harness/...,
    configs/...), a path that climbs out of its folder (../README.md) or an upper-case document name (README.md)."""
    out = []
    for token in PATHLIKE.findall(text):
        token = token.rstrip(".")
        if PLACEHOLDER.search(token):
            continue
        top, _, rest = token.partition("/")
        sweep_output = top == "results" and rest.split("/")[0] not in TRACKED_RESULTS
        if top in REPOSITORY_ENTRIES and rest and not sweep_output or top == ".." or DOC_NAME.fullmatch(token):
            out.append(token)
    return out


def markdown_link_targets(text: str) -> list[tuple[str, str]]:
    """(path, #fragment) of each local Markdown link of `text`; an empty path is the document itself."""
    return [tuple(match.partition("#")[::2]) for match in MARKDOWN_LINK.findall(text) if not URL_SCHEME.match(match)]


def heading_anchors(document: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ +(.+)$", document.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def broken_link(document: Path, path: str, fragment: str) -> bool:
    target = document.parent / path if path else document
    if path and unresolved(document, path, from_root=False):
        return True
    return bool(fragment) and target.suffix == ".md" and fragment not in heading_anchors(target)


def unresolved(document: Path, name: str, *, from_root: bool) -> bool:
    """True unless `name` is a file or folder inside the repository (from its root or from `document`'s folder)."""
    bases = [REPO_ROOT, document.parent] if from_root else [document.parent]
    return not any((base / name).resolve().is_relative_to(REPO_ROOT) and (base / name).exists() for base in bases)


@pytest.mark.parametrize("document", markdown_files(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_paths_and_links_in_markdown_exist(document):
    missing = []
    for line_number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1):
        missing += [f"line {line_number}: {name}" for name in dict.fromkeys(markdown_paths(line))
                    if (str(document.relative_to(REPO_ROOT)), name) not in OTHER_REPOSITORIES_PATHS
                    and unresolved(document, name, from_root=not name.startswith(".."))]
        missing += [f"line {line_number}: link {path}#{fragment}".rstrip("#")
                    for path, fragment in markdown_link_targets(line) if broken_link(document, path, fragment)]
    assert missing == []


def test_the_markdown_check_finds_repository_paths_and_links():
    text = ("`harness/cli.py`, results/bench/summary.md#x, results/default/leaderboard.md, results/<sweep>/run.json, "
            "configs/sweeps/paper-*.yaml, see DESIGN.md, ../shared/STYLE.md and verl/trainer/ppo/core_algos.py.")
    assert markdown_paths(text) == ["harness/cli.py", "results/bench/summary.md", "DESIGN.md", "../shared/STYLE.md"]
    links = "[a](docs/statistics.md#intervals) [b](https://github.com/x/y) [c](#quickstart) [d](../x.md \"t\")"
    assert markdown_link_targets(links) == [("docs/statistics.md", "intervals"), ("", "quickstart"), ("../x.md", "")]
    readme = REPO_ROOT / "README.md"
    assert unresolved(readme, "DESIGN.md", from_root=True)
    outside = os.path.relpath(re.__file__, REPO_ROOT)  # a file that exists, outside the repository
    assert unresolved(readme, outside, from_root=False)
    assert not unresolved(readme, "docs/statistics.md", from_root=False)
    assert not unresolved(REPO_ROOT / "docs" / "architecture.md", "../README.md", from_root=False)


def test_every_other_repositorys_path_is_still_cited():
    cited = {(document, name) for document, name in OTHER_REPOSITORIES_PATHS
             if name in markdown_paths((REPO_ROOT / document).read_text(encoding="utf-8"))}
    assert cited == set(OTHER_REPOSITORIES_PATHS)


def test_the_link_check_finds_missing_files_and_headings():
    readme = REPO_ROOT / "README.md"
    assert "what-is-and-is-not-verified" in heading_anchors(readme)
    assert not broken_link(readme, "docs/budgets.md", "several-processes-per-run")
    assert broken_link(readme, "docs/budgets.md", "no-such-heading")
    assert broken_link(readme, "docs/nosuch.md", "")
    assert broken_link(readme, "", "no-such-heading")
