"""The fuzz suite's size: at least 10,000 cases in a run (the issue's floor), counted as they ran.

Named to run after the other fuzz modules (pytest runs a directory's files in name order). When only part of
the suite ran (``-k``, one file), there is nothing to add up and the check is skipped.
"""

from __future__ import annotations

import pytest

from tests.fuzz.cases import RAN
from tests.fuzz.test_raw_socket import SCALE

FUZZERS = {"tests.fuzz.test_parse_props", "tests.fuzz.test_gateway_props", "tests.fuzz.test_raw_socket"}


def test_a_whole_fuzz_run_tries_at_least_10000_cases() -> None:
    if set(RAN) != FUZZERS:
        pytest.skip(f"only part of the fuzz suite ran: {sorted(RAN)}")
    print(f"\nfuzz cases this run: {dict(RAN)}, {sum(RAN.values())} in all")
    assert sum(RAN.values()) >= 10_000 * SCALE
