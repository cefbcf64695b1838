"""lumotree: exact reference and fast Triton runtime for tree speculative decoding on hybrid GDN + attention models.

Layers (each a subpackage): ``lumotree.reference`` (exact, any number system), ``lumotree.proofs`` (sympy/Z3 checks),
``lumotree.expressivity`` (parity-conditioned retrieval), ``lumotree.optimized`` (Triton kernels and GPU runtime).
"""

import os as _os

__version__ = "0.1.0"
__all__ = ["__version__"]

# The layer folders (reference/, optimized/, ...) sit beside this folder in a source checkout and are mapped onto
# lumotree.* by setup.py. When this file is imported straight from a checkout (the checkout root is on sys.path, e.g.
# `python -m ...` run there), point the package path at the root too so the layers resolve the same way.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "setup.py")) and _os.path.isdir(_os.path.join(_checkout, "reference")):
    __path__.append(_checkout)  # type: ignore[name-defined]  # noqa: F821
