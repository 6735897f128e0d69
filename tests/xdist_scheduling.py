"""How `make test` spreads the suite over its pytest-xdist workers (`-n 2 --dist loadfile`).

One test file is one unit of work, so a file's module-scoped fixtures (an imported real model, a
transformers model, a template store) are built once, on one worker. Two refinements:

  - SAME_WORKER: files that share a session fixture too costly to build twice (a transformers
    model of a real base) run on the same worker, as one unit;
  - LONGEST_FIRST: the files that take longest start first; a long file started last would keep
    one worker busy while the other has nothing left to do. The order only changes when a file
    starts, never what it asserts; a file missing from the list simply starts later.

Durations measured with `pytest --durations=60` on the 2-core machine (docs/testing.md).
"""

from __future__ import annotations

SAME_WORKER = {
    "tests/real/test_gemma_real.py": "gemma3-transformers",  # both load Gemma 3 in transformers
    "tests/real/test_arch_real.py": "gemma3-transformers",
    "tests/real/test_run_real.py": "smollm2-transformers",  # both load SmolLM2 in transformers
    "tests/real/test_adapters_real.py": "smollm2-transformers",
}

LONGEST_FIRST = [
    "tests/real/test_gemma_real.py",
    "tests/real/test_arch_real.py",
    "tests/real/test_run_real.py",
    "tests/real/test_adapters_real.py",
    "tests/serve/test_openai_structured_real.py",  # 40 sampled answers of SmolLM2 and Gemma 3: ~7 min
    "tests/durability/test_crash.py",
    "tests/real/test_demo_adapters.py",
    "tests/cli/test_hostile.py",
    "tests/unit/test_fuzz.py",
    "tests/serve/test_serve.py",
    "tests/durability/test_durability.py",
    "tests/durability/test_follow_powercut.py",
    "tests/durability/test_follow_crash.py",
    "tests/serve/test_serve_real.py",
    "tests/distribution/test_dist_crash.py",
    "tests/fleet/test_fleet_router.py",  # a fleet of 3 replicas built, then 4 routers in front of it
    "tests/fleet/test_fleet_failover.py",
    "tests/fleet/test_follow_fleet.py",  # five `slm follow` processes through four versions, twice
    "tests/distribution/test_dist_registry.py",
    "tests/distribution/test_dist_bundle.py",
    "tests/cli/test_concurrency.py",
    "tests/unit/test_quant_kquants.py",
]


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or its SAME_WORKER group."""
    path = file_of(nodeid)
    return SAME_WORKER.get(path, path)


def longest_first(items: list) -> list:
    """Items reordered so that the LONGEST_FIRST files come first (in that order), the others
    after them in collection order; a file's own tests keep their order."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    last = len(LONGEST_FIRST)
    return sorted(items, key=lambda item: rank.get(file_of(item.nodeid), last))  # sorted() is stable


def make_scheduler(config, log):
    """--dist loadfile with the two refinements above; None (xdist's own) for any other --dist."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    # units start in collection order (see longest_first), not sorted by their number of tests
    config.option.loadscopereorder = False
    return FileScheduling(config, log)
