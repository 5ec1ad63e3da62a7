"""worker_pool.py: a worker's reply that is not one JSON object (not JSON, a list, a number) is one error, the
same for every worker script (`bad_reply`); the worker that sent it is killed and the pool starts a fresh one."""

from __future__ import annotations

import pytest

from posttrain.bounded import BoundedError
from posttrain.worker_pool import WorkerPool, bad_reply

SCRIPT = """
import sys
sys.stdout.write("ready\\n"); sys.stdout.flush()
for line in sys.stdin:
    sys.stdout.write(line); sys.stdout.flush()  # echoes the request's "reply" as its reply
"""


@pytest.fixture
def echo_pool(tmp_path):
    script = tmp_path / "echo_worker.py"
    script.write_text(
        SCRIPT.replace("sys.stdout.write(line)", 'import json; sys.stdout.write(json.loads(line)["reply"] + "\\n")')
    )
    pool = WorkerPool(script, "echo worker", size=1)
    yield pool
    pool.close()


@pytest.mark.parametrize("reply", ["not json", "[1, 2]", "7", '"text"', "null"])
def test_a_reply_that_is_not_one_json_object_is_a_bad_reply(echo_pool, reply):
    with pytest.raises(BoundedError, match="^the echo worker sent a bad reply$"):
        echo_pool.request({"reply": reply}, budget_s=10, max_reply=1000)
    assert echo_pool.request({"reply": '{"ok": 1}'}, budget_s=10, max_reply=1000) == {"ok": 1}
    assert echo_pool.started == 2  # the bad one was killed; a fresh one answered


def test_bad_reply_names_the_worker_and_cuts_what_it_sent():
    assert str(bad_reply("regex worker")) == "the regex worker sent a bad reply"
    sent = {"x": "y" * 500}
    assert str(bad_reply("math checker", sent)) == "the math checker sent a bad reply: " + str(sent)[:200]
