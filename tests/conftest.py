import os

import pytest

# Tests run several small torch computations; one thread avoids oversubscribing a 2-core machine when pytest
# runs next to other work, and keeps results bit-identical between runs.
os.environ.setdefault("OMP_NUM_THREADS", "1")


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
