"""Packaging facts: every layer folder ships under lumotree.*, and the reference never imports triton."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("reference", "optimized", "proofs", "expressivity", "training", "workloads")


def test_every_layer_is_a_package_and_no_tests_inside_layers():
    for layer in LAYERS:
        assert (ROOT / layer / "__init__.py").is_file(), f"{layer}/ must be a package"
        assert not list((ROOT / layer).rglob("test_*.py")), f"tests belong in tests/, not {layer}/"


def test_setup_maps_every_subpackage():
    out = subprocess.run(
        [sys.executable, "-c", "import runpy, setuptools, json;"
         "setuptools.setup = lambda **kw: print(json.dumps(kw));"
         "runpy.run_path('setup.py')"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    import json

    kw = json.loads(out.stdout.strip().splitlines()[-1])
    for init in (ROOT / "lumotree").rglob("__init__.py"):  # the front ends' own subpackages (lumotree.server)
        name = ".".join(("lumotree", *init.parent.relative_to(ROOT / "lumotree").parts))
        assert name in kw["packages"], f"{name} missing from the computed package list"
    for layer in LAYERS:
        assert f"lumotree.{layer}" in kw["packages"]
        for init in (ROOT / layer).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / layer)
            name = ".".join(("lumotree", layer, *rel.parts))
            assert name in kw["packages"], f"{name} missing from the computed package list"


def test_reference_does_not_import_triton():
    code = "import sys, lumotree.reference, lumotree.reference.gdn, lumotree.reference.tree; " \
           "import pkgutil, importlib, lumotree.reference as r; " \
           "[importlib.import_module('lumotree.reference.' + m.name) for m in pkgutil.iter_modules(r.__path__)]; " \
           "print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
