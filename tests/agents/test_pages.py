"""docs/agents/*.md cannot rot: each page's code runs. The "point it at posttrain" block runs against the served
scripted policy (its address and key swapped in), the task file is loaded as `posttrain train` loads it and its agent
trains one AgentEnv step, and (slow) the page's `posttrain train` command runs in smoke mode on tiny-random."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from scripted_policy import weather_rules

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning"
)  # langgraph 1.x on create_react_agent (test_langchain.py)

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"openai_agents": "agents", "pydantic_ai": "pydantic_ai", "langchain": "langgraph"}  # page: its import
URL, KEY = "http://127.0.0.1:8000/v1", '"EMPTY"'
COMMAND = "posttrain train task.name=weather_agent.py:make_task"
SMOKE = [
    "model.name=tiny-random",
    "loop.steps=1",
    "loop.eval_prompts=2",
    "logging.tensorboard=false",
    "loop.save_every=0",
    "model.threads=1",
]


def blocks(page: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", (ROOT / "docs" / "agents" / f"{page}.md").read_text(), re.S | re.M)


@pytest.mark.parametrize("page", PAGES)
def test_the_page_shows_an_agent_a_task_file_and_the_command_and_is_linked(page):
    assert len(blocks(page, "python")) == 2 and blocks(page, "bash") == [COMMAND + "\n"]
    assert not re.findall(r"^```(?!python|bash|\n)", (ROOT / "docs" / "agents" / f"{page}.md").read_text(), re.M)
    assert f"(agents/{page}.md)" in (ROOT / "docs" / "agents.md").read_text()
    assert f"agents/{page}.md" in (ROOT / "mkdocs.yml").read_text()


@pytest.mark.parametrize("page", PAGES)
def test_the_point_it_at_posttrain_block_runs_against_the_server(page, served, capsys):
    pytest.importorskip(PAGES[page])
    code = blocks(page, "python")[0]
    assert code.count(URL) == 1 and code.count(KEY) == 1, "the block's one changed line"
    code = code.replace(URL, served.base_url).replace(KEY, repr(served.api_key))
    exec(compile(code, f"docs/agents/{page}.md", "exec"), {"__name__": f"docs_{page}"})
    assert capsys.readouterr().out == "It is sunny in Paris.\n"
    assert "sunny, 21 C in Paris" in served.policy.prompts[1]  # the tool ran and its result reached the policy


def _task_file(page: str, folder: Path) -> Path:
    code = blocks(page, "python")[1]
    assert code.startswith("# weather_agent.py\n")
    path = folder / "weather_agent.py"
    path.write_text(code)
    return path


@pytest.mark.parametrize("page", PAGES)
def test_the_task_file_loads_and_its_agent_trains_one_step(page, tmp_path, train_one_step):
    pytest.importorskip(PAGES[page])
    from posttrain.envs.agent import AgentEnv
    from posttrain.models.tiny import tiny_tokenizer
    from posttrain.tasks.load import load_task

    task = load_task(f"{_task_file(page, tmp_path)}:make_task")
    assert task.env_factory is not None
    env = task.env_factory(task, tiny_tokenizer(), None)
    assert isinstance(env, AgentEnv) and env.task is task
    step = train_one_step(env.agent_fn, weather_rules(), task=task)
    m = step.metrics
    assert all(t.reward == 1.0 and len(t.turns) == 2 for t in step.trajectories), [t.reward for t in step.trajectories]
    assert m["agent/chains"] == 1 and m["agent/dropped_calls"] == 0 and m["weights/changed"] == 1.0, m
    assert m["train/sampler_logp_abs_diff"] < 1e-3, m


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_page_s_train_command_runs_in_smoke_mode(page, tmp_path):
    pytest.importorskip(PAGES[page])
    path = _task_file(page, tmp_path)
    argv = COMMAND.replace("weather_agent.py", str(path)).split()
    r = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", *argv[1:], *SMOKE, f"run.output_dir={tmp_path}/runs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert list(tmp_path.glob("runs/*/summary.json"))
