"""The repository's shape: the package map, file sizes, imports that respect package boundaries, benchmarks and tests
kept apart, and product text that speaks of the project only (no development history)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("reference", "optimized", "proofs", "expressivity", "training", "workloads")
PRODUCT = (*LAYERS, "lumotree")
MAX_LINES = 600  # product code and benchmarks

#: the runtime's packages and the server's, and the modules each must have (each concept in one place)
PACKAGE_MAP = {
    "optimized/ops": {"checks", "pdl", "tree_meta", "gdn_decode"},
    "optimized/ops/gdn_tree": {"api", "config", "primitives", "solve", "apply", "portable", "fused", "fused_kernel",
                               "commit", "pending", "common", "reference"},
    "optimized/ops/tree_attention": {"attention", "prepare", "kv_commit"},
    "optimized/ops/conv_tree": {"kernels", "reference"},
    "optimized/ops/gemv": {"kernels", "linear"},
    "optimized/ops/moe": {"kernels", "routed", "reference", "resources"},
    "optimized/model": {"model", "weights", "loader", "caches", "layers", "kernels", "graphs", "presets", "memory",
                        "mtp"},
    "optimized/engine": {"engine", "targets", "records", "budget", "drafters", "mtp", "sampling", "e2e", "demo",
                         "prefix_cache"},
    "optimized/parallel": {"context", "shard", "launch", "bench"},
    "training": {"model", "gdn", "corpus", "formats", "tokenizer", "data", "trainer", "organism", "cli"},
    "workloads": {"build"},
    "lumotree/server": {"app", "loop", "protocol", "text", "metrics", "cli", "loadgen", "follow"},
}


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    """``lumotree.<layer>...`` for a product file (the layer folders map onto ``lumotree.*``)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts if parts[0] == "lumotree" else ["lumotree", *parts])


def package_of(module: str, path: Path | None = None) -> str:
    return module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]


def resolve(importer: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names."""
    if not node.level:
        return node.module or ""
    base = package_of(importer, path).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_package_map():
    """The runtime is ops (one package or module per op family), model and engine, each with its stages."""
    for package, modules in PACKAGE_MAP.items():
        folder = ROOT / package
        assert (folder / "__init__.py").is_file(), f"{package} is not a package"
        have = {p.stem for p in folder.glob("*.py")}
        have |= {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
        assert modules <= have, f"{package} lacks {sorted(modules - have)}"
    stray = sorted(p.name for p in (ROOT / "optimized").glob("*.py") if p.name != "__init__.py")
    assert not stray, f"modules outside the runtime's packages: {stray}"


@pytest.mark.parametrize("folder", [*PRODUCT, "bench"])
def test_files_stay_small(folder):
    long = {str(p.relative_to(ROOT)): n for p in python_files(folder)
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_no_private_name_crosses_a_package():
    """A ``_private`` name (or module) is used only inside the package that defines it."""
    bad = []
    for path in python_files(*PRODUCT):
        importer = module_name(path)
        home = package_of(importer, path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = resolve(importer, path, node)
                names = [a.name for a in node.names]
                target_package = target if (ROOT / Path(*target.split(".")[1:]) / "__init__.py").exists() \
                    or target == "lumotree" else target.rpartition(".")[0]
                crossing = target_package != home and target.startswith("lumotree")
                private_module = any(private(part) for part in target.split("."))
                if crossing and (private_module or any(private(n) for n in names)):
                    bad.append(f"{path.relative_to(ROOT)}: from {target} import {', '.join(names)}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("lumotree") and any(private(p) for p in alias.name.split(".")):
                        bad.append(f"{path.relative_to(ROOT)}: import {alias.name}")
    assert not bad, "private names imported across packages:\n" + "\n".join(bad)


def test_tests_use_public_names_and_benchmarks_stay_apart():
    """Tests import only public names of the library and never the benchmarks; benchmarks never import tests."""
    bad = []
    for path in python_files("tests"):
        text = path.read_text()
        aliases = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lumotree"):
                for a in node.names:
                    if private(a.name) or any(private(p) for p in node.module.split(".")):
                        bad.append(f"{path.name}: from {node.module} import {a.name}")
                    aliases.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("lumotree"):
                        aliases.add(a.asname or a.name.split(".")[0])
        for alias in aliases:
            for m in re.finditer(rf"(?<![\w.]){re.escape(alias)}\.(_[a-z]\w*)", text):
                bad.append(f"{path.name}: {alias}.{m.group(1)}")
        if re.search(r"""/ ["']bench["']|["']bench/[\w/.]*["']""", text) and path.name != "test_layout.py":
            bad.append(f"{path.name}: reads the benchmarks")
    for path in python_files("bench"):
        if re.search(r"^\s*(from|import)\s+(tests|test_\w+|strategies|conftest)\b", path.read_text(), re.M):
            bad.append(f"bench/{path.name}: imports the tests")
    assert not bad, "\n".join(bad)


#: development history in product text: sessions, numbered runs and issues, lab folders, work logs
HISTORY = re.compile(
    r"\bsessions?\b|\bruns? [0-9]+\b|\bissues? #?[0-9]+\b|bench/results|\bNOTES-|(?-i:\bRESULTS\.md\b)"
    r"|development log|\bwork ?log\b|\bprobe scripts?\b|DESIGN\.md",
    re.I,
)
#: phrases of the product itself that the pattern above would take for history
ALLOWED = re.compile(r"agent sessions?|a session's|sessions? of an agent|per session", re.I)
DATE = re.compile(r"\b20[0-9]{2}-[01][0-9]-[0-3][0-9][a-z]?\b")


def history_lines(path: Path, dates: bool) -> list[str]:
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = ALLOWED.sub("", line)
        if HISTORY.search(text) or (dates and DATE.search(text)):
            out.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    return out


def test_no_development_history_in_docs_or_product_code():
    """Docs and code state what the code does and its current numbers; git keeps the history. Code carries no dates
    (a docs table names the date of its measurement), and neither cites the design notes outside the repository."""
    lines = []
    for path in python_files(*PRODUCT, "bench"):
        lines += history_lines(path, dates=True)
    for path in sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md", ROOT / "mkdocs.yml"]):
        lines += history_lines(path, dates=False)
    assert not lines, "development history in product text:\n" + "\n".join(lines[:40])


def test_no_lab_notebook_files():
    """No result folders, appended diaries, patches or probe scripts in the tree: one baseline JSON per benchmark."""
    assert not (ROOT / "bench" / "results").exists()
    leftovers = [p.name for p in ROOT.rglob("*") if p.suffix in (".patch", ".diff") and ".venv" not in p.parts]
    assert not leftovers, leftovers
    assert not list((ROOT / "bench").glob("*.md")), "notes files in bench/"
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")}
    baselines = {p.stem for p in (ROOT / "bench" / "baselines").glob("*.json")}
    orphans = {b for b in baselines  # BENCH.json, or BENCH_MODE.json for a mode of the benchmark (e2e_real)
               if not any(b == s or b.startswith(f"{s}_") for s in scripts)}
    assert not orphans, f"baselines without a benchmark: {sorted(orphans)}"
