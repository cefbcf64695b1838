"""Test configuration: kernels run under the Triton interpreter when no GPU is present.

``TRITON_INTERPRET`` must be set before any kernel module is imported, so it is set here, at collection start.
GPU tests are marked ``gpu`` and skipped unless a CUDA device is present (run them with ``pytest -m gpu``).
"""

from __future__ import annotations

import os


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing
        return False


HAS_CUDA = _cuda_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], derandomize=True
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# ``pytest --hypothesis-profile=deep``: random (not derandomized) examples, DEEP_FACTOR times as many as each test asks
# for (at least DEEP_EXAMPLES): the on-demand search for inputs the fixed CI examples miss
DEEP_FACTOR = 10
DEEP_EXAMPLES = 200
settings.register_profile(
    "deep",
    max_examples=DEEP_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _deepen(items) -> None:
    """Under the ``deep`` profile, scale the examples of tests that fix their own ``max_examples``."""
    scaled = set()
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if own is not None and id(test) not in scaled:  # parametrized items share one test function
            scaled.add(id(test))
            examples = max(DEEP_EXAMPLES, DEEP_FACTOR * own.max_examples)
            test._hypothesis_internal_use_settings = settings(own, max_examples=examples, derandomize=False)


@pytest.fixture
def one_torch_thread():
    """torch on one thread (tiny ops on a shared 2-core machine), put back after the test."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def one_torch_thread_no_grad(one_torch_thread):
    """:func:`one_torch_thread` without autograd."""
    import torch

    with torch.no_grad():
        yield


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if HAS_CUDA else 0


def pytest_collection_modifyitems(config, items):
    if settings.get_current_profile_name() == "deep":
        _deepen(items)
    if any("multigpu" in item.keywords for item in items) and _cuda_devices() < 2:
        skip_multi = pytest.mark.skip(reason="needs at least 2 CUDA GPUs (pytest -m multigpu on a multi-GPU kind)")
        for item in items:
            if "multigpu" in item.keywords:
                item.add_marker(skip_multi)
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (pytest -m gpu on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)

import sys  # noqa: E402

# Shared test helpers (tests/strategies.py, ...) import as top-level modules.
sys.path.insert(0, os.path.dirname(__file__))
