import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import hermetic  # noqa: E402 - tests/hermetic.py, found by the path above (tests/ is not a package)

# Tests run several small torch computations; one thread avoids oversubscribing a 2-core machine when pytest
# runs next to other work, and keeps results bit-identical between runs.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Before anything caches a path: every cache, home and run folder of the session goes to one temporary root
# (tests/hermetic.py); the converted default model is the one input shared with the user's cache.
SESSION = hermetic.enter()


@pytest.fixture(autouse=True)
def _torch_threads():
    import torch

    torch.set_num_threads(1)
    yield


@pytest.fixture
def tiny():
    from posttrain.models import load_model

    model, tok = load_model("tiny-random", seed=0)
    return model, tok


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`), the cluster tests share one worker: they
    share one two-node Ray cluster (tests/cluster/conftest.py), which each worker would otherwise start again."""
    for item in items:
        if "/tests/cluster/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.xdist_group("ray"))


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session, exitstatus):
    """After everything else (the xdist workers are gone by then): the session fails when it wrote under the user's
    home or left a /dev/shm block or a process behind. Only the process that made the root checks and removes it."""
    yield
    if "posttrain.worker_pool" in sys.modules:  # the regex, math and reasoning-gym pools' workers: closed now
        sys.modules["posttrain.worker_pool"].close_all_pools()
    if _is_worker(session.config) or not SESSION.owner:
        return
    problems = hermetic.leftovers(SESSION, skip=[SESSION.models, Path(str(session.config.rootpath)), SESSION.root])
    hermetic.leave(SESSION)
    if problems:
        print("\n\nThe test session was not hermetic:\n  " + "\n  ".join(problems), file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
