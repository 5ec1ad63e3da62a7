"""The stepper's plugins (loop/wiring.py): choosing the rows returns the plugins with the adaptive chooser in them,
and leaves the dict it was handed as it was (issue 62: it was assigned into from outside its owner)."""

from posttrain.config import load_config
from posttrain.loop.prompt_selector import PromptSelector
from posttrain.loop.row_choice import UniformRows
from posttrain.loop.wiring import row_chooser


def test_an_adaptive_chooser_joins_a_new_plugins_dict():
    given = {"insights": object()}
    cfg = load_config(None, ["loop.prompt_selection=adaptive"])
    chooser, plugins = row_chooser(cfg, 8, given, lambda _: None)
    assert isinstance(chooser, PromptSelector) and plugins == {**given, "prompt_selection": chooser}
    assert list(given) == ["insights"]  # the caller's dict is not edited


def test_a_uniform_chooser_adds_no_plugin():
    given: dict = {}
    chooser, plugins = row_chooser(load_config(None, []), 8, given, lambda _: None)
    assert isinstance(chooser, UniformRows) and plugins == {} and given == {}
