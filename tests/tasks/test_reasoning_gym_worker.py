"""reasoning-gym's scorers in a killable worker process (tasks/_reasoning_gym_worker.py, tasks/reasoning_gym_screen.py):
a scorer that runs long is killed at its timeout and scores 0, the next scores are unaffected, a score that is not a
finite number is 0, and no worker process outlives its pool."""

import os
import threading
import time

import pytest

pytest.importorskip("reasoning_gym")

from posttrain.envs.smoke_checks import score_completion
from posttrain.tasks import reasoning_gym as rg
from posttrain.tasks.load import load_task


@pytest.fixture(autouse=True, scope="module")
def _scorers_end_with_the_module():
    """The process's scorer workers end with this module's tests, not at interpreter exit (after the session's
    check for processes left behind)."""
    yield
    from posttrain.tasks.reasoning_gym_screen import close_scorer_pool

    close_scorer_pool()

BOMB = "R9999999"  # rubiks_cube's expand_moves writes it out as ten million moves: minutes of CPU
LOOP = "A+99999999999"  # rush_hour's perform_moves loops once per step, in little memory: hours


def _task(name, **options):
    return load_task(f"reasoning_gym:{name}", {"train_size": 4, "eval_size": 1, **options})


def _cols(row):
    return {k: v for k, v in row.items() if k != "prompt"}


@pytest.mark.parametrize("screened", [True, False])
def test_a_rubiks_cube_bomb_scores_zero_in_time_and_later_scores_are_unaffected(screened, monkeypatch):
    """Five `R9999999` answers in a row, then right answers to three other datasets: each bomb scores 0 within its
    timeout (screened, or killed in the worker when the screen is off) and the right answers still score 1.0.
    Before: each bomb's scorer thread kept running; after four, every reasoning-gym score was skipped (0.0)."""
    if not screened:
        monkeypatch.setattr(rg, "screen", lambda *a, **k: True)
    cube = _task("rubiks_cube", score_timeout_s=1.0)
    score = cube.rubric.components[0].func
    for _ in range(5):
        t0 = time.monotonic()
        s = score_completion(cube, cube.train_rows[0], f"<answer>{BOMB}</answer>")
        assert time.monotonic() - t0 < 20.0
        assert s.components["rg_score"] == 0.0 and not s.passed and not s.failed
    for name in ("basic_arithmetic", "chain_sum", "gcd"):
        task = _task(name)
        for row in task.train_rows[:2]:
            s = score_completion(task, row, f"<answer>{row['answer']}</answer>")
            assert s.components["rg_score"] == 1.0 and s.passed, (name, row["answer"], s)
    counts = score.drain_metrics()
    assert counts == ({"reasoning_gym/score_screened": 5.0} if screened else {"reasoning_gym/score_timeouts": 5.0})


def test_a_scorer_that_hangs_or_raises_scores_zero_for_that_sample_only(monkeypatch):
    """One batch: a scorer killed at its timeout, one that raises (prime_factorization's int('x')), a right answer."""
    monkeypatch.setattr(rg, "screen", lambda *a, **k: True)
    hang = _task("rush_hour").train_rows[0]
    boom = _task("prime_factorization").train_rows[0]
    task = _task("spell_backward", score_timeout_s=0.5)
    right = task.train_rows[0]
    texts = [f"<answer>{LOOP}</answer>", "<answer>x</answer>", f"<answer>{right['answer']}</answer>"]
    t0 = time.monotonic()
    scores = task.rubric.score([[{"role": "assistant", "content": t}] for t in texts],
                               [_cols(r) for r in (hang, boom, right)])
    assert time.monotonic() - t0 < 20.0
    assert [s.failed for s in scores] == [False] * 3 and [s.passed for s in scores] == [False, False, True]
    m = task.rubric.components[0].func.drain_metrics()
    assert m == {"reasoning_gym/score_timeouts": 1.0, "reasoning_gym/score_errors": 1.0}
    assert task.rubric.components[0].func.drain_metrics() == {}


def _descendants(pid: int) -> set[int]:
    """Every living process below `pid` (from /proc's parent links), zombies not counted."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            parents.setdefault(int(ppid), []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _worker_processes(direct: bool = False) -> set[int]:
    """This process's scorer workers and the scorers they forked (`direct`: only the workers)."""
    found = set()
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                ours = b"_reasoning_gym_worker" in f.read()
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ours and (ppid == os.getpid() or not direct):
            found.add(pid)
    return found


def test_no_worker_process_is_left_after_the_pool_closes():
    """A pool's idle workers end when it closes; a busy one (and the scorer it forked) when its call hands it back.
    Before: a worker busy at the close went back into the pool and lived on."""
    from posttrain.tasks.reasoning_gym_screen import score_in_worker, scorer_pool

    cars = _task("rush_hour").train_rows[0]
    before = _worker_processes()  # the process's own pool's (building a task starts it)
    pool = scorer_pool(new=True)
    got: dict[str, list] = {}

    def run(name: str, timeout_s: float) -> None:
        got[name] = score_in_worker(pool, [(cars["rg_spec"], cars["rg_entry"], LOOP)], timeout_s, 60.0)

    short = threading.Thread(target=run, args=("short", 2.0))
    long = threading.Thread(target=run, args=("long", 20.0))
    short.start()
    long.start()  # two workers, each forking a scorer that loops
    short.join(90)
    assert got["short"] == ["timeout"] and long.is_alive()
    pool.close()  # the idle worker ends now; the busy one when its call returns
    deadline = time.monotonic() + 10
    while len(_worker_processes(direct=True) - before) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_worker_processes(direct=True) - before) == 1 and long.is_alive()
    long.join(90)
    assert got["long"] == ["timeout"]
    deadline = time.monotonic() + 10
    while _worker_processes() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _worker_processes() - before


def test_a_score_that_is_not_a_finite_number_is_zero():
    """`min(1.0, exp(-nan))` is 1.0 inside a scorer; a scorer that returns NaN itself scores 0, as does anything
    that is not a number."""
    from posttrain.tasks import _reasoning_gym_worker as worker

    assert worker.result(float("nan")) == "nonfinite" and worker.result(float("-inf")) == "nonfinite"
    assert worker.result(10**400) == "nonfinite" and worker.result("1.0") == "error" and worker.result(None) == "error"
    assert worker.result(True) == 1.0 and worker.result(0.25) == 0.25

    class Replies:  # a pool whose worker sends what a broken scorer would make of it
        def request(self, request, *args, **kwargs):
            return {"results": ["nonfinite", 7.0, -1.0, "timeout", "error", "bogus", 0.5][: len(request["rows"])]}

    row = _task("gcd").train_rows[0]
    score = rg.ScoreAnswer(pool=Replies())
    values = score.score(["1"] * 7, [row["rg_entry"]] * 7, [row["rg_spec"]] * 7)
    assert values == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5]
    assert score.drain_metrics() == {"reasoning_gym/score_nonfinite": 1.0, "reasoning_gym/score_timeouts": 1.0,
                                     "reasoning_gym/score_errors": 2.0}
