"""The hypothesis profiles of tests/conftest.py: ``ci`` (the default: derandomized, the examples each test asks for)
and ``deep`` (``pytest --hypothesis-profile=deep``: random examples, ten times as many, at least 200)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    from hypothesis import given, settings, strategies as st

    SEEN = []

    @settings(max_examples=7)
    @given(st.integers(0, 10**9))
    def test_draws(x):
        SEEN.append(x)

    def test_report():
        print("PROBE", settings.get_current_profile_name(), len(SEEN), settings.default.derandomize)
    """
)


def run_probe(tmp_path, *args: str) -> list[str]:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
    env.pop("HYPOTHESIS_PROFILE", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "conftest", "-p", "no:cacheprovider", *args,
         str(tmp_path / "test_probe.py")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return next(line for line in done.stdout.splitlines() if "PROBE" in line).split("PROBE ", 1)[1].split(" ", 2)


def test_ci_profile_is_derandomized_and_deep_is_random_with_more_examples(tmp_path):
    assert run_probe(tmp_path) == ["ci", "7", "True"]
    assert run_probe(tmp_path, "--hypothesis-profile=deep") == ["deep", "200", "False"]
