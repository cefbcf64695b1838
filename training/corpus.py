"""The training corpus: real code and prose the machine already holds, split into train / held-out by path hash.

Sources (:func:`default_sources`): CPython's standard library (``sysconfig.get_paths()['stdlib']``, its
``site-packages`` / ``dist-packages`` left out), CPython's documentation where a Debian ``python3.X-doc`` package
installed it (``/usr/share/doc/python3*``: ``.txt`` / ``.rst`` sources), and the sources of the installed packages
named in :data:`PINNED_PACKAGES` (found with ``importlib.util.find_spec``, nothing imported). Each file is named by
``SOURCE/relative/path`` (machine independent); a file is held out iff the first 8 bytes of ``sha256(name)`` read as
an integer fall below ``heldout_fraction * 2**64``, so a held-out file is never trained on, on any machine and for any
file list. :func:`corpus_digest` hashes the sorted ``name, sha256(content)`` lines: the recipe records it.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PINNED_PACKAGES", "Source", "CorpusFile", "default_sources", "collect", "is_heldout", "split",
           "corpus_digest"]

#: installed packages whose sources join the corpus (those present; the recipe records which were found)
PINNED_PACKAGES = ("numpy", "torch", "transformers", "triton", "sympy")
#: file suffixes read per source kind
CODE_SUFFIXES = (".py",)
DOC_SUFFIXES = (".txt", ".rst")
MAX_FILE_BYTES = 400_000  # larger files are generated tables, not prose or code anyone wrote


@dataclass(frozen=True)
class Source:
    """A folder of the corpus: files under ``root`` with one of ``suffixes``, named ``name/relative/path``."""

    name: str
    root: str
    suffixes: tuple[str, ...] = CODE_SUFFIXES
    exclude: tuple[str, ...] = ()  # top-level folders of root left out


@dataclass(frozen=True)
class CorpusFile:
    name: str  # SOURCE/relative/path
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def default_sources(packages: tuple[str, ...] = PINNED_PACKAGES) -> list[Source]:
    """The standard library, CPython's documentation if installed, and the pinned packages that are installed."""
    stdlib = sysconfig.get_paths()["stdlib"]
    sources = [Source("stdlib", stdlib, CODE_SUFFIXES, exclude=("site-packages", "dist-packages", "__pycache__"))]
    for doc in sorted(glob.glob("/usr/share/doc/python3.[0-9]*")):
        if any(next(Path(doc).rglob("*" + s), None) is not None for s in DOC_SUFFIXES):
            sources.append(Source("doc/" + Path(doc).name, doc, DOC_SUFFIXES))
    for package in packages:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue
        sources.append(Source(package, list(spec.submodule_search_locations)[0], CODE_SUFFIXES))
    return sources


def collect(sources: list[Source]) -> list[CorpusFile]:
    """Every readable UTF-8 file of the sources (up to :data:`MAX_FILE_BYTES`, not empty), sorted by name."""
    files: dict[str, CorpusFile] = {}
    for source in sources:
        root = Path(source.root)
        if not root.is_dir():
            raise NotADirectoryError(f"source {source.name!r}: root = {source.root!r} is not a directory")
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(root)
            if rel_dir == Path("."):
                dirnames[:] = [d for d in dirnames if d not in source.exclude]
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for filename in sorted(filenames):
                if not filename.endswith(source.suffixes):
                    continue
                path = Path(dirpath) / filename
                try:
                    if path.is_symlink() or not 0 < path.stat().st_size <= MAX_FILE_BYTES:
                        continue
                    text = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                name = f"{source.name}/{(rel_dir / filename).as_posix()}"
                files[name] = CorpusFile(name, text.replace("\r\n", "\n"))
    return [files[name] for name in sorted(files)]


def is_heldout(name: str, heldout_fraction: float) -> bool:
    """Whether the file named ``name`` is held out (module docstring)."""
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction = {heldout_fraction!r} must be in [0, 1)")
    value = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big")
    return value < heldout_fraction * 2 ** 64


def split(files: list[CorpusFile], heldout_fraction: float) -> tuple[list[CorpusFile], list[CorpusFile]]:
    """(train, held-out) by :func:`is_heldout`."""
    train = [f for f in files if not is_heldout(f.name, heldout_fraction)]
    heldout = [f for f in files if is_heldout(f.name, heldout_fraction)]
    return train, heldout


def corpus_digest(files: list[CorpusFile]) -> str:
    """sha256 of the sorted ``name\\tsha256(content)\\n`` lines."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.name):
        h.update(f"{f.name}\t{f.sha256}\n".encode())
    return h.hexdigest()
