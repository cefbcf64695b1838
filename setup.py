"""Map the top-level layer folders onto the ``lumotree.*`` namespace.

The package list is computed, never written out, so a new subpackage can not be silently dropped from the wheel.
"""

import os

from setuptools import find_packages, setup

LAYERS = ("reference", "optimized", "proofs", "expressivity", "training", "workloads")

package_dir = {"lumotree": "lumotree"}
packages = ["lumotree", *(f"lumotree.{sub}" for sub in find_packages(where="lumotree"))]
for layer in LAYERS:
    if not os.path.isfile(os.path.join(layer, "__init__.py")):
        continue  # a layer not yet started (tests/test_packaging.py checks every layer ships)
    package_dir[f"lumotree.{layer}"] = layer
    packages.append(f"lumotree.{layer}")
    for sub in find_packages(where=layer):
        packages.append(f"lumotree.{layer}.{sub}")
        package_dir[f"lumotree.{layer}.{sub}"] = f"{layer}/" + sub.replace(".", "/")

setup(packages=packages, package_dir=package_dir)
