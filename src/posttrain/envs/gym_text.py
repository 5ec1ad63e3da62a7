"""GymTextEnv: any Gymnasium env as a multi-turn posttrain Env, one model call per env step.

    user: <row prompt>\n\n<first observation> ─► policy ─► reply ─► text_to_action ─► env.step ─► user: <obs> ─► ...

Each turn the observation is a user message; the model's reply is parsed into an action. A reply that does not
parse (text_to_action raises ValueError) is a bad action: the env is not stepped, the error goes back to the model
as the next user message, and it is counted (`bad_actions`); it uses up a turn, so a model that never answers
properly runs out of turns instead of looping. The episode ends when the env terminates or truncates, or after
`max_turns` model calls. The reward is the episode return (the rubric component `episode_return` reads it from
the `episode_return` column this env adds; a task may use any other rubric over the same columns).

Spaces: an env with a `Text` observation space needs no `obs_to_text` and one with a `Text` action space no
`text_to_action` (the reply, stripped, is the action). For other spaces pass the pair, e.g. for FrozenLake
`obs_to_text=lambda s: f"you are on cell {s}"` and `text_to_action=parse_direction`. A `Discrete` space without a
parser accepts a reply that is just the action's number.

Token fidelity is ToolEnv's (envs/tool_env.py): each turn's prompt is the previous prompt + the sampled ids + the
env's tokens (the end of the assistant turn if the sampler stopped before it, the user message, the generation
prompt), which get loss mask 0.

Per-episode metrics (Trajectory.metrics, logged as `episode/<key>`): return, turns, env_steps, bad_actions,
bad_action_rate, and whatever the env's `episode_metrics()` returns, if it has one (on `env.unwrapped`).
`env.step` / `env.reset` run in a thread under `step_timeout_s`: a hung env fails its trajectory, not the run.

Context, as in ToolEnv: each observation is cut to the task's `max_observation_chars` with a marker the model reads,
and an episode whose next turn no longer fits the sampler's context ends with `stop_reason` "context", trained on
as truncated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from posttrain.bounded import truncate_text
from posttrain.envs.isolate import prompt_text
from posttrain.envs.scoring import scores_of_ok
from posttrain.envs.single_turn import score_with_rubric
from posttrain.envs.task import Task
from posttrain.envs.tool_env import sample_turn, turn_end_text
from posttrain.models.template_check import ChatTemplateError, check_prefix_property_once, render_ids
from posttrain.rewards.rubric import Score
from posttrain.sampling.base import Sampler
from posttrain.types import SampleParams, Trajectory, Turn


def episode_return(completions: list[Any], episode_return: list[float] | None = None, **_: Any) -> list[float]:
    """Rubric component: the episode return GymTextEnv recorded (0 where there is none)."""
    if episode_return is None:
        return [0.0] * len(completions)
    return [float(r or 0.0) for r in episode_return]


def default_text_to_action(space: Any) -> Callable[[str], Any]:
    from gymnasium import spaces

    if isinstance(space, spaces.Text):
        return lambda text: text.strip()
    if isinstance(space, spaces.Discrete):

        def parse(text: str) -> int:
            s = text.strip()
            try:
                a = int(s)
            except ValueError:
                raise ValueError(
                    f"reply with the action's number ({space.start}..{space.start + space.n - 1}), got {s[:40]!r}"
                ) from None
            if not space.contains(a):
                raise ValueError(f"action {a} is out of range {space.start}..{space.start + space.n - 1}")
            return a

        return parse
    raise ValueError(f"the env's action space {space} is not Text or Discrete: pass text_to_action")


def default_obs_to_text(space: Any) -> Callable[[Any], str]:
    from gymnasium import spaces

    if isinstance(space, spaces.Text):
        return str
    raise ValueError(f"the env's observation space {space} is not Text: pass obs_to_text")


class GymTextEnv:
    def __init__(
        self,
        task: Task,
        tokenizer: Any,
        params: SampleParams,
        make_env: Callable[[dict[str, Any]], Any],
        obs_to_text: Callable[[Any], str] | None = None,
        text_to_action: Callable[[str], Any] | None = None,
        max_turns: int = 20,
        system_prompt: str | None = None,
        seed_column: str = "seed",
        step_timeout_s: float = 10.0,
        check_template: bool = True,
    ):
        """`make_env(row) -> gymnasium.Env` builds a fresh env per episode (rollouts run concurrently, so envs are
        never shared); it is reset with `seed=row[seed_column]` when the row has one."""
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.task, self.tok, self.params = task, tokenizer, params
        self.make_env, self.obs_to_text, self.text_to_action = make_env, obs_to_text, text_to_action
        self.max_turns, self.system_prompt, self.seed_column = max_turns, system_prompt, seed_column
        self.step_timeout_s = step_timeout_s
        if check_template:
            check_prefix_property_once(tokenizer, tool_role="user")
        self.turn_end = turn_end_text(tokenizer)

    def prompt_ids(self, row: dict[str, Any]) -> list[int]:
        """The first prompt without the observation (for length estimates, as SingleTurnEnv.prompt_ids)."""
        return render_ids(self.tok, self._messages(row, ""), add_generation_prompt=True)

    def _messages(self, row: dict[str, Any], first_obs: str) -> list[dict[str, Any]]:
        prompt = row["prompt"]
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if first_obs:
            last = msgs[-1]
            last["content"] = f"{last['content']}\n\n{first_obs}" if last.get("role") == "user" else last["content"]
            if last.get("role") != "user":
                msgs.append({"role": "user", "content": first_obs})
        if self.system_prompt:
            msgs.insert(0, {"role": "system", "content": self.system_prompt})
        return msgs

    def _env_tokens(self, msgs: list[dict[str, Any]], completion_ids: list[int]) -> list[int]:
        """Tokens between the sampled completion and the next generation (ToolEnv._env_tokens for one user
        message): the rest of the assistant turn + the user message + the generation prompt."""
        before = self.tok.apply_chat_template(msgs[:-1], tokenize=False)
        after = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        if not after.startswith(before):
            raise ChatTemplateError(
                f"the chat template of {getattr(self.tok, 'name_or_path', 'this model')!r} "
                "rewrote earlier turns when a user message was added"
            )
        sampled = self.tok.decode(completion_ids, skip_special_tokens=False)
        k = max((k for k in range(len(self.turn_end) + 1) if sampled.endswith(self.turn_end[:k])), default=0)
        return list(self.tok(self.turn_end[k:] + after[len(before) :], add_special_tokens=False)["input_ids"])

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.wait_for(asyncio.to_thread(fn, *args, **kwargs), self.step_timeout_s)

    async def rollout(self, row: dict[str, Any], sampler: Sampler, params: SampleParams | None = None) -> Trajectory:
        params = params or self.params
        keep = replace(params, keep_prefix=True)  # the next turn extends this one: keep its KV
        env = self.make_env(row)
        raw_text = self.obs_to_text or default_obs_to_text(env.observation_space)
        limit = self.task.max_observation_chars

        def to_text(o: Any) -> str:  # what the model reads of an observation: bounded before it is tokenized
            return truncate_text(raw_text(o), limit)[0]

        to_action = self.text_to_action or default_text_to_action(env.action_space)
        seed = row.get(self.seed_column)
        turns: list[Turn] = []
        stats = {"return": 0.0, "env_steps": 0.0, "bad_actions": 0.0, "terminated": 0.0, "truncated": 0.0}
        actions: list[Any] = []
        msgs: list[dict[str, Any]] = []
        error, stop_reason = None, "max_turns"
        try:
            obs, _ = await self._call(env.reset, seed=None if seed is None else int(seed))
            msgs = self._messages(row, to_text(obs))
            ids = render_ids(self.tok, msgs, add_generation_prompt=True)
            for k in range(self.max_turns):
                c = await sample_turn(sampler, ids, keep, first=k == 0)
                if c is None:
                    stop_reason = "context"
                    turns[-1] = replace(turns[-1], finish_reason="length")  # truncated, trained on as such
                    break
                turns.append(
                    Turn(
                        prompt_ids=ids,
                        completion_ids=c.token_ids,
                        completion_logprobs=c.logprobs,
                        policy_version=c.policy_version,
                        finish_reason=c.finish_reason,
                        token_versions=c.token_versions,
                    )
                )
                msgs.append({"role": "assistant", "content": c.text})
                try:
                    action = to_action(c.text)
                except ValueError as e:
                    stats["bad_actions"] += 1
                    feedback = f"Invalid action: {e}"
                else:
                    actions.append(action)
                    obs, r, term, trunc, _ = await self._call(env.step, action)
                    stats["return"] += float(r)
                    stats["env_steps"] += 1
                    if term or trunc:
                        stats["terminated" if term else "truncated"] = 1.0
                        stop_reason = "terminated" if term else "truncated"
                        break
                    feedback = to_text(obs)
                if k == self.max_turns - 1:
                    break
                msgs.append({"role": "user", "content": feedback})
                ids = ids + list(c.token_ids) + self._env_tokens(msgs, c.token_ids)
        except TimeoutError:
            error = f"env reset/step took longer than {self.step_timeout_s}s"
        except Exception as e:  # noqa: BLE001 - a broken env fails its trajectory, not the run
            error = f"env raised {type(e).__name__}: {e}"
        finally:
            close = getattr(env, "close", None)
            if callable(close):
                close()
        if not turns:  # the env failed before the first model call
            turns = [Turn([], [], [], sampler.policy_version)]
        stats["turns"] = float(sum(1 for m in msgs if m["role"] == "assistant"))
        stats["bad_action_rate"] = stats["bad_actions"] / max(stats["turns"], 1.0)
        stats["context_stop"] = float(stop_reason == "context")
        episode: Callable[[], dict[str, Any]] | None = getattr(getattr(env, "unwrapped", env), "episode_metrics", None)
        if callable(episode) and error is None:
            stats.update({k: float(v) for k, v in episode().items()})
        last_reply = next((m["content"] for m in reversed(msgs) if m["role"] == "assistant"), "")
        traj = Trajectory(
            turns=turns,
            prompt_text=prompt_text(row["prompt"]),
            completion_text=last_reply,
            row=row,
            metrics=stats,
            extra={"actions": [str(a) for a in actions]},
            messages=msgs,
            stop_reason=stop_reason if error is None else None,
            failed=error is not None,
            error=error,
        )
        return traj

    async def score(self, trajectories: list[Trajectory]) -> list[Score]:
        return scores_of_ok(
            trajectories,
            lambda ok: score_with_rubric(
                self.task, ok, lambda t: {"episode_return": t.metrics.get("return", 0.0), "episode": dict(t.metrics)}
            ),
        )
