"""``lumotree expressivity check``: the PCR-S separation section end to end (quick scope) lists every claim with a
status, and every claim holds; bad section names are refused."""

import json

import pytest

from lumotree.cli import main as cli_main
from lumotree.expressivity import check, separation


def test_quick_separation_report(capsys):
    code = cli_main(["expressivity", "check", "--quick", "--sections", "separation", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"]
    claims = report["claims"]
    assert {c["status"] for c in claims} == set(separation.STATUSES)
    assert all(c["holds"] for c in claims)
    s = report["separation"]
    assert s["proof"]["status"] == "proved" and s["lower_bound"]["status"] == "proved"
    assert s["hybrid"]["accuracy_min"] == 1.0 and s["hybrid"]["construction"]["scratchpad_tokens"] == 0
    for attack in s["attacks"]["rows"]:  # every pure-GDN model fails, within the proved bound
        assert attack["found"] and attack["within_bound"]
    assert s["memory"]["exact_within_range"] and s["memory"]["fails_beyond"]
    rows = s["hybrid"]["cache_precision"]["rows"]
    assert all(r["fails_one_bit_below"] for r in rows) and rows[-1]["frac_bits"] > rows[0]["frac_bits"]


def test_sections_are_validated():
    with pytest.raises(ValueError, match="sections"):
        check.run_check(quick=True, sections=("nope",))


def test_parity_reduction_is_exhaustive():
    result = check.parity_reduction(6)
    assert result["status"] == "proved" and result["bit_strings"] == 2 + 4 + 8 + 16 + 32 + 64
