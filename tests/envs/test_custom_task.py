import json

import pytest

from posttrain.envs import TaskLoadError
from posttrain.tasks.load import load_task
from posttrain.tasks.load import to_task


def test_example_custom_task_loads_and_scores():
    task = load_task("examples/custom_task.py:make_task")
    assert not task.conversational and len(task.eval_rows) == 40 and task.stop == ["\n"]
    row = task.train_rows[0]
    visits = int(row["prompt"].split(" times")[0].split()[-1])
    good, wordy, shorter = f" {row['answer']}", f" It opened in {row['answer']}.", f" in {row['answer']}"
    distractor = f" {visits}"  # the other number in the sentence
    scores = task.rubric.score([good, wordy, shorter, distractor], [row] * 4)
    # the shaping pays 1/words for the right year: a shorter right reply beats a wordier one (a group of
    # right-but-wordy replies keeps a direction), the bare year gets the headline too
    assert [s.reward for s in scores] == [2.0, 0.25, 0.5, 0.0]
    assert [s.passed for s in scores] == [True, False, False, False]
    # held-out sentences are new ones
    assert not {r["prompt"] for r in task.eval_rows} & {r["prompt"] for r in task.train_rows}


def test_module_path_and_options():
    task = load_task("posttrain.tasks.count_a:make_task", {"n_train": 5, "n_eval": 2})
    assert len(task.train_rows) == 5 and len(task.eval_rows) == 2


def test_dataset_and_tuple_returns():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"prompt": f"q{i}", "x": i} for i in range(30)])
    task = to_task((ds, [lambda completions, **kw: [0.0] * len(completions)]), "t")
    assert not task.conversational and len(task.eval_rows) == 3 and len(task.train_rows) == 27
    assert task.rubric.components[0].name == "reward_0"


def test_bad_task_specs(tmp_path):
    with pytest.raises(TaskLoadError, match="unknown task"):
        load_task("nope")
    with pytest.raises(TaskLoadError, match="not found"):
        load_task(str(tmp_path / "x.py") + ":make_task")
    f = tmp_path / "broken.py"
    f.write_text("raise RuntimeError('bad import')\n")
    with pytest.raises(TaskLoadError, match="importing .* failed: RuntimeError: bad import"):
        load_task(f"{f}:make_task")
    g = tmp_path / "wrong.py"
    g.write_text("def make_task():\n    return 42\n")
    with pytest.raises(TaskLoadError, match="must return a Task"):
        load_task(f"{g}:make_task")
    h = tmp_path / "noprompt.py"
    h.write_text("def make_task():\n    return {'train': [{'text': 'hi'}], 'rewards': [len]}\n")
    with pytest.raises(ValueError, match="no 'prompt' key"):
        load_task(f"{h}:make_task")
    with pytest.raises(TaskLoadError, match="rejected options"):
        load_task("count-a", {"bogus": 1})
    with pytest.raises(TaskLoadError, match="cannot import module"):
        load_task("no_such_module_xyz:make_task")


def test_tool_task_example_loads_and_trains_a_step(tmp_path):
    from posttrain.config import load_config
    from posttrain.envs.tool_env import ToolEnv
    from posttrain.loop import train
    from posttrain.loop.components import build

    task = load_task("examples/tool_task.py:make_task")
    assert task.tools and task.max_turns == 3
    over = ["model.name=tiny-random", "task.name=examples/tool_task.py:make_task", "loop.steps=1",
            "loop.eval_prompts=2", "logging.tensorboard=false", "logging.console=false", "loop.save_every=0",
            f"run.output_dir={tmp_path}", "sampling.max_tokens=8"]
    assert isinstance(build(load_config(None, over)).env, ToolEnv)
    assert train(load_config(None, over)).steps == 1
    # its demonstrations pass its own rubric, so the warm start trains on all of them
    res = train(load_config(None, over + ["warm_start.steps=2", "warm_start.demos=12", "loop.steps=0"]))
    summary = json.loads((res.run_dir / "summary.json").read_text())
    assert summary["warm_start"]["demos"] == 12 and summary["warm_start"]["demos_failed"] == 0
