"""A rollout sampler's first weight push: a failure closes what the sync holds and is raised, never swallowed."""

import pytest

from posttrain.sampling.base import first_push


class _Sync:
    def __init__(self, fail: BaseException | None):
        self.fail, self.pushed, self.closed = fail, [], False

    def push(self, version):
        if self.fail is not None:
            raise self.fail
        self.pushed.append(version)

    def close(self):
        self.closed = True


def test_a_good_first_push_keeps_the_sync_open():
    s = _Sync(None)
    first_push(s, 3)
    assert s.pushed == [3] and not s.closed


@pytest.mark.parametrize("error", [RuntimeError("server gone"), KeyboardInterrupt()])
def test_a_failed_first_push_closes_the_sync_and_raises(error):
    s = _Sync(error)
    with pytest.raises(type(error)):
        first_push(s, 0)
    assert s.closed
