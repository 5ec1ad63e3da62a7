"""docs/agents/smolagents.md and docs/agents/mini_swe_agent.md cannot rot: the "point it at posttrain" block runs
against the served scripted policy (its address and key swapped in), and the task file is loaded as `posttrain train`
loads it and its agent trains one AgentEnv step (test_pages.py does the same for the other frameworks' pages)."""

import os
import re
import runpy
from pathlib import Path

import pytest
from scripted_policy import Prompt, Rule, always, has_tools, tool_call

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported (test_mini_swe_agent.py)
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

ROOT = Path(__file__).resolve().parents[2]
URL, KEY = "http://127.0.0.1:8000/v1", '"EMPTY"'


def blocks(page: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", (ROOT / "docs" / "agents" / f"{page}.md").read_text(), re.S | re.M)


def smol_weather_rules() -> list[Rule]:
    """get_weather(Paris), then the final_answer tool with what it said (smolagents writes results as user text)."""
    return [
        Rule(lambda p: has_tools(p) and "Observation:" not in p.text, tool_call("get_weather", {"city": "Paris"})),
        Rule(has_tools, tool_call("final_answer", {"answer": "It is sunny in Paris."})),
        Rule(always, "It is sunny in Paris."),
    ]


def swe_rules(answer: str = "3") -> list[Rule]:
    def first(p: Prompt) -> str:
        a, b = map(int, re.findall(r"Write (\d+) \+ (\d+)", p.text)[-1])
        return tool_call("bash", {"command": f"echo {a + b} > answer.txt"})

    return [
        Rule(
            lambda p: p.last_role == "tool",
            tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt"}),
        ),
        Rule(always, first),
    ]


PAGES = {  # page: (its import, its script, what the first block prints, the task file's name)
    "smolagents": ("smolagents", smol_weather_rules, "It is sunny in Paris.\n", "weather_agent.py"),
    "mini_swe_agent": ("minisweagent", swe_rules, "3\n", "swe_agent.py"),
}


@pytest.mark.parametrize("page", PAGES)
def test_the_page_shows_an_agent_a_task_file_and_the_command(page):
    name = PAGES[page][3]
    assert len(blocks(page, "python")) == 2 and blocks(page, "bash") == [
        f"posttrain train task.name={name}:make_task\n"
    ]
    assert not re.findall(r"^```(?!python|bash|\n)", (ROOT / "docs" / "agents" / f"{page}.md").read_text(), re.M)


@pytest.mark.parametrize("page", PAGES)
def test_the_point_it_at_posttrain_block_runs_against_the_server(page, served, capsys, tmp_path):
    module, rules, printed, _ = PAGES[page]
    pytest.importorskip(module)
    served.script(rules())
    code = blocks(page, "python")[0]
    assert code.count(URL) == 1 and code.count(KEY) == 1, "the block's one changed line"
    code = code.replace(URL, served.base_url).replace(KEY, repr(served.api_key))
    (tmp_path / f"docs_{page}.py").write_text(code)  # a file: smolagents' @tool reads its function's source
    runpy.run_path(str(tmp_path / f"docs_{page}.py"), run_name=f"docs_{page}")
    # The last line: litellm prints a "Provider List" notice when it looks up a price for a model it does not know.
    assert capsys.readouterr().out.splitlines()[-1] == printed.strip()


@pytest.mark.parametrize("page", PAGES)
def test_the_task_file_loads_and_its_agent_trains_one_step(page, tmp_path, train_one_step):
    module, rules, _, name = PAGES[page]
    pytest.importorskip(module)
    from posttrain.envs.agent import AgentEnv
    from posttrain.models.tiny import tiny_tokenizer
    from posttrain.tasks.load import load_task

    code = blocks(page, "python")[1]
    assert code.startswith(f"# {name}\n")
    (tmp_path / name).write_text(code)
    task = load_task(f"{tmp_path / name}:make_task")
    assert task.env_factory is not None
    env = task.env_factory(task, tiny_tokenizer(), None)
    assert isinstance(env, AgentEnv) and env.task is task
    step = train_one_step(env.agent_fn, rules(), rows=task.train_rows[:1], task=task)
    assert all(t.reward == 1.0 for t in step.trajectories), [t.reward for t in step.trajectories]
    assert step.metrics["agent/dropped_calls"] == 0 and step.metrics["weights/changed"] == 1.0, step.metrics


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_page_s_train_command_runs_in_smoke_mode(page, tmp_path):
    """The page's `posttrain train task.name=<file>:make_task`, as written, in smoke mode on tiny-random (a random
    policy: its episodes may fail or score 0; the run must still train, evaluate and finish)."""
    import subprocess
    import sys

    pytest.importorskip(PAGES[page][0])
    (command,) = blocks(page, "bash")
    path = tmp_path / PAGES[page][3]
    path.write_text(blocks(page, "python")[1])
    argv = command.replace(PAGES[page][3], str(path)).split()
    smoke = ["model.name=tiny-random", "loop.steps=1", "loop.eval_prompts=2", "logging.tensorboard=false",
             "loop.save_every=0", "model.threads=1", "sampling.max_tokens=16"]
    r = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", *argv[1:], *smoke, f"run.output_dir={tmp_path}/runs"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert list(tmp_path.glob("runs/*/summary.json"))
