"""How `make test` spreads the files over its workers (tests/xdist_scheduling.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import xdist_scheduling as xs

ROOT = Path(__file__).resolve().parents[2]


def test_every_listed_file_exists():
    listed = set(xs.LONGEST_FIRST) | set(xs.SAME_WORKER)
    assert sorted(p for p in listed if not (ROOT / p).is_file()) == []
    assert len(xs.LONGEST_FIRST) == len(set(xs.LONGEST_FIRST))


def test_longest_first_keeps_each_files_tests_together_and_in_order():
    ids = ["tests/test_a.py::one", "tests/test_a.py::two", "tests/durability/test_crash.py::x[1]",
           "tests/test_b.py::one", "tests/durability/test_crash.py::x[2]", "tests/real/test_run_real.py::y"]
    got = [i.nodeid for i in xs.longest_first([SimpleNamespace(nodeid=n) for n in ids])]
    assert got == ["tests/real/test_run_real.py::y", "tests/durability/test_crash.py::x[1]", "tests/durability/test_crash.py::x[2]",
                   "tests/test_a.py::one", "tests/test_a.py::two", "tests/test_b.py::one"]


def test_a_unit_is_a_file_or_its_shared_worker_group():
    assert xs.unit_of("tests/test_b.py::t[x::y]") == "tests/test_b.py"
    assert xs.unit_of("tests/real/test_gemma_real.py::t") == xs.unit_of("tests/real/test_arch_real.py::u")
    assert xs.unit_of("tests/real/test_gemma_real.py::t") != xs.unit_of("tests/real/test_run_real.py::t")
