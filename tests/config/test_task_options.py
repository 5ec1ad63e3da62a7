"""The options of the task kinds posttrain reads itself, checked by models when the config is validated
(config/task_options.py): each bad value is one line naming its key path and what is allowed."""

from __future__ import annotations

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.config.formats import ANSWER_FORMATS

MIX = "task.name=mixture"


@pytest.mark.parametrize("overrides, expected", [
    # mixture parts (was tasks/mixture.py _part)
    ([MIX, "task.options.tasks=[{name: count-a, wieght: 2}]"],
     "task.options.tasks[0].wieght: unknown key (did you mean 'weight'?)"),
    ([MIX, "task.options.tasks=[{name: count-a, weight: 0}]"], "task.options.tasks[0].weight: 0: Input should be"),
    ([MIX, "task.options.tasks=[{name: count-a, weight: true}]"], "task.options.tasks[0].weight: True:"),
    ([MIX, "task.options.tasks=[{options: {}}]"], "task.options.tasks[0].name: Field required"),
    ([MIX, "task.options.tasks=[{name: count-a}, {name: count-a}]"], "task names must be unique"),
    ([MIX, "task.options.tasks=[]"], "task.options.tasks: "),
    ([MIX, "task.options.tasks=[{name: 'reasoning_gym:leg_counting', options: {answer_format: boxd}}]"],
     "task.options.tasks[0].options.answer_format: 'boxd': Input should be 'auto', 'answer_tag', 'boxed', "
     "'last_line', 'last_number' or 'none' (did you mean 'boxed'?)"),
    # reasoning-gym options (was tasks/reasoning_gym.py _options)
    (["task.name=reasoning_gym:leg_counting", "task.options.train_size=0"],
     "task.options.train_size: 0: Input should be greater than or equal to 1"),
    (["task.name=reasoning_gym:leg_counting", "task.options={size: 10, train_size: 10}"],
     "give train_size or size, not both"),
    (["task.name=reasoning_gym:leg_counting", "task.options.answer_format=xml"], "task.options.answer_format: 'xml'"),
    (["task.name=reasoning_gym:leg_counting", "task.options={score_timeout_s: '5'}"],
     "task.options.score_timeout_s: '5'"),
    (["task.name=reasoning_gym:leg_counting", "task.options.fallback=1"], "task.options.fallback"),
    # verifiers' own options (was tasks/verifiers_task.py OWN_OPTIONS)
    (["task.name=verifiers:x", "task.options.episode_threads=0"], "task.options.episode_threads: 0:"),
    (["task.name=verifiers:x", "task.options.max_observation_chars=0"], "task.options.max_observation_chars: 0:"),
    (["task.name=verifiers:x", "task.options.timeout_s=-1"], "task.options.timeout_s: -1"),
    (["task.name=verifiers:x", "task.options.n_train=true"], "task.options.n_train: True"),
    # eval-suite tasks (was loop/eval_suite.py _named) and its answer format (was a plain str)
    (["eval_suite.tasks=[{name: count-a, promts: 3}]"],
     "eval_suite.tasks[0].promts: unknown key (did you mean 'prompts'?)"),
    (["eval_suite.tasks=[{options: {}}]"], "eval_suite.tasks[0].name: Field required"),
    (["eval_suite.tasks=[count-a]"], "eval_suite.tasks[0]: 'count-a': Input should be a valid dictionary"),
    (["eval_suite.tasks=[{name: mixture, options: {tasks: [{name: a, weight: -1}]}}]"],
     "eval_suite.tasks[0].options.tasks[0].weight: -1: Input should be greater than 0"),
    (["eval_suite.answer_format=boxd"], "eval_suite.answer_format: 'boxd': Input should be 'auto', 'answer_tag'"),
])
def test_bad_task_options_are_refused_by_the_config_in_one_line(overrides, expected):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("invalid config: ") and expected in msg, msg


def test_good_options_pass_and_other_tasks_options_are_their_factorys():
    cfg = load_config(None, [MIX, "task.options.tasks=[{name: count-a, weight: 2, label: a}, {name: reversal}]",
                             "eval_suite.tasks=[{name: 'reasoning_gym:leg_counting', options: {size: 8}}]",
                             "eval_suite.answer_format=boxed"])
    assert cfg.eval_suite.tasks[0].name == "reasoning_gym:leg_counting" and cfg.eval_suite.answer_format == "boxed"
    load_config(None, ["task.name=count-a", "task.options={anything: 1}"])  # count-a's factory checks its own


def test_the_answer_formats_are_one_list():
    from posttrain.rewards.extract import EXTRACTORS
    from posttrain.tasks.reasoning_gym import _INSTRUCTIONS

    assert tuple(EXTRACTORS) == ANSWER_FORMATS and tuple(_INSTRUCTIONS) == ANSWER_FORMATS
