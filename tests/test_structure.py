"""The package's structure: no import circle between modules and no import up the layers.

It reads the imports of every module of `mindspore_hyper` with `ast` (nothing is imported, so no
MindSpore): module-level imports, those inside functions (a lazy import is still a dependency)
and those under `if TYPE_CHECKING:` (they never run, but a type named there is a dependency all
the same: a circle through one is a circle a reader must follow). `import a.b` is an edge to
module a.b; `from a.b import c` is an edge to module a.b.c when that is a module, else to a.b
(its `__init__` when a.b is a package).

The implicit runs of parent packages are not edges: importing mindspore_hyper.x.y first runs
mindspore_hyper/__init__.py, which imports the whole public API, and x/__init__.py. Counting
them would put every module in one circle with the package facade and hide the real structure.
So only what an import statement names counts; the facade `mindspore_hyper/__init__.py` is a
node of its own in the "public API" layer, and a module below it that imports `mindspore_hyper`
(e.g. `import mindspore_hyper as mh`) is an import up the layers.

The layer table, the known remaining circles and upward imports live in
mindspore_hyper/_layers.py (read with runpy, outside the package); the layer section of
docs/architecture.md is generated from it: `python tests/test_structure.py` rewrites it.
"""
from __future__ import annotations

import ast
import functools
import os
import runpy
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import pytest

from paths import REPO_ROOT

PACKAGE = "mindspore_hyper"
PACKAGE_DIR = os.path.join(REPO_ROOT, PACKAGE)
ARCHITECTURE = os.path.join(REPO_ROOT, "docs", "architecture.md")
BEGIN, END = "<!-- layers: begin", "<!-- layers: end -->"


@dataclass(frozen=True)
class Edge:
    """`source` imports `target` (module names without the package prefix; "" is the facade)."""

    source: str
    target: str
    line: int
    local: bool  # inside a function


def find_modules(package_dir: str, extensions: Sequence[str] = ()) -> Dict[str, Optional[str]]:
    """Module name (without the package prefix; "" for the package itself) -> its file (None for
    an extension module)."""
    modules: Dict[str, Optional[str]] = {name: None for name in extensions}
    for folder, _, files in os.walk(package_dir):
        for f in files:
            if f.endswith(".py"):
                parts = os.path.relpath(os.path.join(folder, f), package_dir)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                modules[".".join(parts)] = os.path.join(folder, f)
    return modules


def _import_nodes(tree: ast.AST) -> Iterable[Tuple[ast.stmt, bool]]:
    """(import statement, inside a function) for every import, type-only ones included."""
    stack: List[Tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, local = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, local
            stack.append((child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))))


def _short(name: str, package: str) -> Optional[str]:
    if name == package:
        return ""
    if name.startswith(package + "."):
        return name[len(package) + 1:]
    return None


def import_edges(modules: Dict[str, Optional[str]], package: str) -> List[Edge]:
    """Every import between modules of the package (see the module docstring)."""
    edges = []
    for source, path in modules.items():
        if path is None:
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        is_package = path.endswith("__init__.py")
        for node, local in _import_nodes(tree):
            targets = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = _short(alias.name, package)
                    while name and name not in modules:  # `import a.b.c` of a name inside a module
                        name = name.rpartition(".")[0]
                    targets.append(name)
            else:
                if node.level:
                    base = source.split(".") if source else []
                    base = base if is_package else base[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = _short(node.module or "", package)
                if module is None:
                    continue
                for alias in node.names:
                    full = f"{module}.{alias.name}" if module else alias.name
                    targets.append(full if full in modules else module)
            edges += [Edge(source, t, node.lineno, local) for t in targets if t is not None and t != source]
    return list(dict.fromkeys(edges))  # one edge per statement and target


def strongly_connected(nodes: Iterable[str], edges: Iterable[Edge]) -> List[Set[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    succ: Dict[str, Set[str]] = {}
    for e in edges:
        succ.setdefault(e.source, set()).add(e.target)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    found: List[Set[str]] = []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(succ.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(succ.get(child, ())))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def unit_of(module: str, units: Iterable[str]) -> Optional[str]:
    """The longest unit that is `module` or a package above it ("" only for the facade)."""
    best = None
    for unit in units:
        if module == unit or (unit and module.startswith(unit + ".")):
            if best is None or len(unit) > len(best):
                best = unit
    return best


def upward_imports(modules: Iterable[str], edges: Iterable[Edge], layers) -> List[Tuple[Edge, str, str]]:
    """(edge, source layer, target layer) for each import of a module in a higher layer."""
    rank = {unit: i for i, (_, units, _) in enumerate(layers) for unit in units}
    out = []
    for e in edges:
        s, t = unit_of(e.source, rank), unit_of(e.target, rank)
        if s is not None and t is not None and rank[t] > rank[s]:
            out.append((e, layers[rank[s]][0], layers[rank[t]][0]))
    return out


def load_table() -> dict:
    return runpy.run_path(os.path.join(PACKAGE_DIR, "_layers.py"))


@functools.lru_cache(maxsize=1)
def analyse():
    """(layer table, modules, import edges) of the package, read once per test session."""
    table = load_table()
    modules = find_modules(PACKAGE_DIR, table["EXTENSION_MODULES"])
    return table, modules, tuple(import_edges(modules, PACKAGE))


def _where(e: Edge) -> str:
    return f"{PACKAGE}.{e.source or '__init__'} line {e.line}{' (in a function)' if e.local else ''} " \
           f"imports {PACKAGE + ('.' + e.target if e.target else '')}"


# -- the checks ----------------------------------------------------------------------------------

@pytest.fixture
def clean_context():
    """Replaces conftest's autouse fixture of the same name here: these tests read files only and
    must not import mindspore_hyper (nor MindSpore)."""
    yield None


def test_every_module_has_a_layer():
    table, modules, _ = analyse()
    units = [u for _, us, _ in table["LAYERS"] for u in us]
    assert len(units) == len(set(units)), "a unit is listed in two layers"
    missing = sorted(m for m in modules if unit_of(m, units) is None)
    assert not missing, f"modules in no layer of mindspore_hyper/_layers.py: {missing}"


def test_no_import_circle_between_modules():
    table, modules, edges = analyse()
    known = [(set(members), item) for members, item in table["KNOWN_CIRCLES"]]
    circles = strongly_connected(modules, edges)
    new = [sorted(c) for c in circles if not any(c <= members for members, _ in known)]
    stale = [item for members, item in known if not any(c & members for c in circles)]
    assert not new, "import circles between modules (open them, or list them in KNOWN_CIRCLES with the " \
                    f"issue item that opens them): {new}"
    assert not stale, f"KNOWN_CIRCLES lists circles that are open now; delete their entries: {stale}"


def test_no_import_up_the_layers():
    table, modules, edges = analyse()
    known = {(a, b) for a, b, _ in table["KNOWN_UPWARD"]}
    found = upward_imports(modules, edges, table["LAYERS"])
    new = [f"{_where(e)} ({low} -> {high})" for e, low, high in found if (e.source, e.target) not in known]
    stale = sorted(known - {(e.source, e.target) for e, _, _ in found})
    assert not new, "imports up the layers of mindspore_hyper/_layers.py:\n" + "\n".join(new)
    assert not stale, f"KNOWN_UPWARD lists imports that are gone; delete their entries: {stale}"


def test_no_import_circle_between_units():
    """Units (the entries of the layer table) that import each other, e.g. two packages of one layer."""
    table, modules, edges = analyse()
    units = [u for _, us, _ in table["LAYERS"] for u in us]
    between = [Edge(unit_of(e.source, units), unit_of(e.target, units), e.line, e.local) for e in edges]
    circles = strongly_connected(units, [e for e in between if e.source != e.target])
    known = [(set(members), item) for members, item in table["KNOWN_UNIT_CIRCLES"]]
    new = [sorted(c) for c in circles if not any(c <= members for members, _ in known)]
    stale = [item for members, item in known if not any(c & members for c in circles)]
    assert not new, f"import circles between units (list them in KNOWN_UNIT_CIRCLES with the issue item): {new}"
    assert not stale, f"KNOWN_UNIT_CIRCLES lists circles that are open now; delete their entries: {stale}"


def test_the_analysis_finds_circles_and_upward_imports(tmp_path):
    """The checks can fail: a made-up package with a circle, an upward and a TYPE_CHECKING import."""
    pkg = tmp_path / "toy"
    (pkg / "low").mkdir(parents=True)
    files = {"__init__.py": "from toy.high import run\n",
             "low/__init__.py": "",
             "low/a.py": "from toy.low import b\n",
             "low/b.py": "def f():\n    from .a import f\n    from toy import high\n",
             "low/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from toy.high import run\n",
             "high.py": "import toy.low.a\nfrom toy import _ext\ndef run():\n    pass\n"}
    for name, text in files.items():
        (pkg / name).write_text(text)
    modules = find_modules(str(pkg), ("_ext",))
    edges = import_edges(modules, "toy")
    assert {(e.source, e.target, e.local) for e in edges} == {
        ("", "high", False), ("low.a", "low.b", False), ("low.b", "low.a", True), ("low.b", "high", True),
        ("low.c", "high", False), ("high", "low.a", False), ("high", "_ext", False)}
    assert strongly_connected(modules, edges) == [{"low.a", "low.b", "high"}]
    layers = (("bottom", ("low", "_ext"), ""), ("top", ("high", ""), ""))
    assert sorted((e.source, e.target) for e, _, _ in upward_imports(modules, edges, layers)) == \
        [("low.b", "high"), ("low.c", "high")]


def test_a_type_only_import_closes_a_circle(tmp_path):
    """Issue 40 item 5: an import under `if TYPE_CHECKING:` is an edge, so a circle through it is found."""
    pkg = tmp_path / "toy"
    pkg.mkdir()
    files = {"__init__.py": "",
             "timeline.py": "from toy.writer import write\n",
             "writer.py": "from typing import TYPE_CHECKING\n"
                          "if TYPE_CHECKING:\n    from toy.timeline import Timeline\n"}
    for name, text in files.items():
        (pkg / name).write_text(text)
    modules = find_modules(str(pkg))
    assert strongly_connected(modules, import_edges(modules, "toy")) == [{"timeline", "writer"}]


def _declared_modes() -> Tuple[str, ...]:
    """`MODES` of mindspore_hyper/context.py (read with `ast`: these tests import nothing)."""
    with open(os.path.join(PACKAGE_DIR, "context.py"), encoding="utf-8") as f:
        for node in ast.parse(f.read()).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MODES" for t in node.targets):
                return tuple(ast.literal_eval(node.value))
    raise AssertionError("mindspore_hyper/context.py declares no MODES")


# a mode's questions are answered by its Runtime: only runtime/ compares a value with a mode's name
MODE_NAMES = tuple(dict.fromkeys(_declared_modes() + ("simulation", "distributed", "native")))
MODE_TESTS_ALLOWED = ("runtime",)  # packages of mindspore_hyper where mode names are the subject
NOT_A_MODE = ("activation_model",)  # names compared with "simulation" meaning something else (the estimator's model)


def _names_a_mode(node: ast.AST) -> bool:
    """A mode's name as a string constant, or a tuple/list/set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in MODE_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_mode(e) for e in node.elts)
    return False


def _identifier(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def mode_tests(source: str) -> List[Tuple[int, str]]:
    """(line, code) of each comparison of a value with a mode's name in `source` (`x == "native"`,
    `mode in ("simulation", "distributed")`), except those of a NOT_A_MODE name."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left] + list(node.comparators)
        if not any(_names_a_mode(o) for o in operands):
            continue
        if any(_identifier(o) in NOT_A_MODE for o in operands):
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_mode_name_tested_outside_the_runtimes():
    """Issue 40 item 1: the runtime answers every mode question (runtime/base.py); the packages
    over it (pipeline, mpmd, rlhf, multimodal, ...) ask their Runtime object, never the mode's
    name; a `mode=` argument is resolved to a runtime once (runtime/modes.py)."""
    _, modules, _ = analyse()
    found = []
    for module, path in sorted(modules.items()):
        if path is None or module.split(".")[0] in MODE_TESTS_ALLOWED:
            continue
        with open(path, encoding="utf-8") as f:
            found += [f"{PACKAGE}/{os.path.relpath(path, PACKAGE_DIR)}:{line}: {code}" for line, code in mode_tests(f.read())]
    assert not found, "mode names tested outside mindspore_hyper/runtime/ (ask the Runtime instead, see " \
                      "runtime/base.py):\n" + "\n".join(found)


def test_the_mode_test_count_finds_comparisons():
    """The check can fail: the comparison forms it counts, and those it leaves alone."""
    source = ("a = mode == 'simulation'\nb = self.mode != 'distributed'\nc = runtime.name in ('native', 'x')\n"
              "d = s.activation_model == 'simulation'\ne = mode == 'record'\nf = 'simulation'\n")
    assert [line for line, _ in mode_tests(source)] == [1, 2, 3]


GENERIC_MODULE_NAMES = {"model.py", "utils.py", "helpers.py", "misc.py", "p2p.py"}
GENERIC_NAMES_ALLOWED = {"comm/p2p.py"}  # the one point-to-point channel everything else encodes onto


def test_modules_are_named_for_what_they_hold():
    """Issue 40 item 5: no module with a generic name (six `model.py` made a reader open each to
    find the class): a module is named for the concept it holds."""
    found = []
    for root, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), PACKAGE_DIR)
            if name in GENERIC_MODULE_NAMES and rel not in GENERIC_NAMES_ALLOWED:
                found.append(rel)
    assert not found, "modules with a generic name (name them for what they hold): " + ", ".join(sorted(found))


def attribute_patches(source: str, package: str = PACKAGE) -> List[Tuple[int, str]]:
    """(line, target) for each attribute a module sets (or deletes) on a name it imported from
    `package`: `Layout.strategy_builder = Strategy`, `setattr(rules, "x", f)`. Such a patch is an
    upward hook when the importer sits higher (the lower module then calls the higher one at run
    time, unseen by the import analysis) and action at a distance otherwise."""
    tree = ast.parse(source)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == package):
            imported.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            imported.update(a.asname or a.name.split(".")[0] for a in node.names
                            if a.name.split(".")[0] == package)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="<setattr>")]
        else:
            continue
        for target in targets:
            for one in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                base = one
                while isinstance(base, (ast.Attribute, ast.Subscript)):
                    base = base.value
                if isinstance(one, ast.Attribute) and isinstance(base, ast.Name) and base.id in imported:
                    found.append((node.lineno, ast.unparse(one)))
    return found


def test_no_module_patches_what_it_imports():
    """Issue 40 item 5: no upward hook. The strategy layer used to install `Layout.strategy_builder`
    so that the algebra called it; now no module of the package sets attributes on a class or module
    it imports from the package."""
    _, modules, _ = analyse()
    found = []
    for module, path in modules.items():
        if path is not None:
            with open(path, encoding="utf-8") as f:
                found += [f"{PACKAGE}.{module or '__init__'} line {line}: {target} = ..."
                          for line, target in attribute_patches(f.read())]
    assert not found, "modules set attributes on what they import (pass it in, or define it there):\n" + \
        "\n".join(found)


def test_the_patch_check_finds_patches():
    source = ("from mindspore_hyper.shard.layout import Layout\nimport mindspore_hyper.dtensor as dt\n"
              "from numpy import ndarray\n"
              "Layout.strategy_builder = object\n"  # line 4: a class of the package
              "def f():\n    setattr(dt, 'x', 1)\n"  # line 6: a module of the package, in a function
              "ndarray.flags = 1\nlocal = Layout((2,), ('a',))\n"  # not the package's; a local name
              "local.cache = {}\nLayout.cache['k'] = 1\n")  # an instance's attribute; an item, not an attribute
    assert attribute_patches(source) == [(4, "Layout.strategy_builder"), (6, "dt.<setattr>")]


MAX_CLASS_LINES = 300


def long_classes(source: str, limit: int = MAX_CLASS_LINES) -> List[Tuple[str, int]]:
    """(name, lines) of each class in `source` spanning more than `limit` lines (decorators excluded)."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > limit]


def test_no_class_over_300_lines():
    """Issue 40 item 5: a class a reader can hold in mind; a longer one holds several concepts that
    want their own modules (PipelineModel was 430 lines before its step, norm, stage mesh, timelines
    and rebalancing moved out)."""
    found = []
    for root, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    found += [f"{os.path.relpath(path, PACKAGE_DIR)}: {cls} ({n} lines)" for cls, n in long_classes(f.read())]
    assert not found, f"classes over {MAX_CLASS_LINES} lines (split them by concept):\n" + "\n".join(found)


def test_the_class_length_check_can_fail():
    source = "class Short:\n    a = 1\n\n\nclass Long:\n" + "    x = 1\n" * 5
    assert long_classes(source, limit=4) == [("Long", 6)]


def test_architecture_doc_shows_the_layer_table():
    with open(ARCHITECTURE, encoding="utf-8") as f:
        text = f.read()
    assert _section(load_table()) in text, \
        "docs/architecture.md's layer section differs from mindspore_hyper/_layers.py: run python tests/test_structure.py"


# -- the doc section -----------------------------------------------------------------------------

def _section(table: dict) -> str:
    lines = [f"{BEGIN} (generated from mindspore_hyper/_layers.py by `python tests/test_structure.py`; "
             "tests/test_structure.py checks it) -->",
             "| layer (lowest first) | units (`mindspore_hyper.` ...) | what they hold |", "|---|---|---|"]
    for name, units, what in table["LAYERS"]:
        shown = " ".join(f"`{u}`" if u else "`__init__` (the facade)" for u in units)
        lines.append(f"| {name} | {shown} | {what} |")
    lines += ["", "Import circles between modules still open:", ""]
    lines += [f"- {', '.join(f'`{m}`' for m in members)}: {item}" for members, item in table["KNOWN_CIRCLES"]] \
        or ["- none"]
    lines += ["", "Import circles between units still open:", ""]
    lines += [f"- {', '.join(f'`{m}`' for m in members)}: {item}" for members, item in table["KNOWN_UNIT_CIRCLES"]] \
        or ["- none"]
    lines += ["", "Imports up the layers still open:", ""]
    lines += [f"- `{a}` -> `{b}`: {item}" for a, b, item in table["KNOWN_UPWARD"]] or ["- none"]
    lines.append(END)
    return "\n".join(lines)


def _write_doc() -> None:
    with open(ARCHITECTURE, encoding="utf-8") as f:
        text = f.read()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < 0:
        raise SystemExit(f"{ARCHITECTURE}: no '{BEGIN}' ... '{END}' section to rewrite")
    with open(ARCHITECTURE, "w", encoding="utf-8") as f:
        f.write(text[:start] + _section(load_table()) + text[end + len(END):])


if __name__ == "__main__":
    _write_doc()
