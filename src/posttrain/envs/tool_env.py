"""ToolEnv: multi-turn episodes where the policy calls tools, up to `max_turns` model calls.

    prompt ─► policy ─► <tool_call>{...}</tool_call> ─► tool runs (timeout) ─► tool message ─► policy ─► ... ─► answer

Token fidelity: each turn's prompt is the previous prompt + the sampled completion ids (as sampled, never
re-tokenized) + the environment's tokens (the end of the assistant turn if the sampler stopped before it, the tool
messages and the next generation prompt, rendered by the chat template). Those env tokens get loss mask 0
(Trajectory.sequence). The template's prefix property is checked once per tokenizer (models/template_check.py).

Thinking models (`Task.thinking`; docs/agents.md): a template with a reasoning block may drop a turn's reasoning
from the history it renders. "split": a turn is extended as above only when the template renders it as it was
sampled; else the next prompt is the template's rendering of the history and the episode goes on in a new chain
(`Trajectory.extra_chains`, sampling/recorder.py `chains_of_turns`; `chains` counts them). "keep": every prompt is
rendered with the variant of the template that keeps every turn's reasoning: one chain.

Reading a turn (sampling/reply_parsers.py): its reasoning block (the model family's, `Task.reasoning_parser`) is
never read for calls; the rest is read for the `<tool_call>` JSON the system prompt asks for, else for the family's
own calls (`Task.tool_parser`: llama3 JSON, Mistral `[TOOL_CALLS]`, Qwen3-Coder XML; auto: the chat template's).

The episode ends when the policy answers without a tool call, calls the `final_tool` (e.g. `answer`), runs out
of turns, or outgrows the model's context (`Trajectory.stop_reason` says which). A malformed call gets an error
message back and is counted; an unknown tool, bad arguments, a raising tool or a timeout likewise. None of them
stop the run.

Context: each tool result is cut to `max_result_chars` (the task's `max_observation_chars`) with a marker the model
reads, before it is tokenized. Before each later turn the sampler's budget (`sampler.context`, sampling/context.py)
is checked against the grown prompt: a turn that cannot fit its max_tokens ends the episode with stop_reason
"context" (under context_overflow=truncate, a turn with at least the budget's minimum room runs with its
max_tokens cut). Such an episode is scored and trained on as truncated (its last turn finish_reason "length"),
not lost. Only a first prompt that does not fit fails the sample (ContextOverflow, with the numbers).

Rewards: the task's rubric scores the final answer; reward functions also receive `tool_calls` (the list of
calls of the episode) and `num_turns` as columns. An optional `turn_reward(turn_index, text, results) -> float`
adds per-turn shaping.

Per-episode tools (`Task.episode`, or `episode_factory`): tools with state (an episode's own copy of a repo) must
not be shared by the episodes running at once. `episode_factory(row)` makes a fresh object per rollout; its
`tools` serve that rollout only (same names as the env's `tools`, which still write the system prompt). When the
episode ends, its optional `finish(final_call)` (sync or async; `final_call` is the call of the `final_tool`, or
None when the episode ended otherwise) returns an EpisodeEnd: metrics merged into `Trajectory.metrics`, and
columns the rubric receives for this episode (e.g. the grade of the final state).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from posttrain.bounded import truncate_text
from posttrain.envs.isolate import prompt_text
from posttrain.envs.single_turn import score_with_rubric
from posttrain.envs.task import Task
from posttrain.envs.tools import EnvWorkerLost, Tool, ToolResult, call_tool, parse_calls, tools_system_prompt
from posttrain.models.template_check import THINKING_MODES, ChatTemplateError, check_multi_turn_template, render_ids
from posttrain.rewards.rubric import Score
from posttrain.sampling.base import Sampler
from posttrain.sampling.context import ContextBudget, ContextOverflow
from posttrain.sampling.recorder import chains_of_turns
from posttrain.sampling.reply_parsers import ReplyParsers
from posttrain.types import Completion, SampleParams, Trajectory, Turn


@dataclass
class EpisodeEnd:
    """What an episode's own tool state reports when the episode ends (see the module doc)."""

    metrics: dict[str, float] = field(default_factory=dict)  # merged into Trajectory.metrics
    columns: dict[str, Any] = field(default_factory=dict)  # extra reward-function columns for this episode


def turn_end_text(tok: Any, chat_template: str | None = None) -> str:
    """What the template writes after an assistant message's content (ChatML: '<|im_end|>\\n')."""
    marker = "XqZ7 marker"
    extra = {"chat_template": chat_template} if chat_template is not None else {}
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}], tokenize=False, **extra
    )
    i = text.rfind(marker)
    return text[i + len(marker) :] if i >= 0 else ""


def opened_text(tok: Any, chat_template: str | None = None) -> str:
    """What the generation prompt writes after the assistant turn's header that the rendered turn writes as its
    content's start (DeepSeek-R1's later template opens '<think>\\n' in the prompt): '' for most templates."""
    extra = {"chat_template": chat_template} if chat_template is not None else {}
    user = [{"role": "user", "content": "hi"}]
    plain = tok.apply_chat_template(user, tokenize=False, **extra)
    gen = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True, **extra)
    marker = "XqZ7 marker"
    turn = tok.apply_chat_template(user + [{"role": "assistant", "content": marker}], tokenize=False, **extra)
    if not (gen.startswith(plain) and turn.startswith(plain) and marker in turn):
        return ""
    header = turn[len(plain) : turn.index(marker)]
    tail = gen[len(plain) :]
    return tail[len(header) :] if tail.startswith(header) else ""


class ToolEnv:
    def __init__(
        self,
        task: Task,
        tokenizer: Any,
        params: SampleParams,
        tools: list[Tool | Callable[..., Any]],
        max_turns: int = 4,
        tool_timeout_s: float = 10.0,
        final_tool: str | None = None,
        tool_role: str = "tool",
        system_prompt: str | None = None,
        turn_reward: Callable[[int, str, list[ToolResult]], float] | None = None,
        check_template: bool = True,
        episode_factory: Callable[[dict[str, Any]], Any] | None = None,
        max_result_chars: int | None = None,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        thinking: str | None = None,
    ):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_result_chars = max_result_chars if max_result_chars is not None else task.max_observation_chars
        if self.max_result_chars < 1:
            raise ValueError(f"max_observation_chars must be >= 1, got {self.max_result_chars}")
        self.task, self.tok, self.params = task, tokenizer, params
        self.tools = {t.name: t for t in (x if isinstance(x, Tool) else Tool.from_function(x) for x in tools)}
        if final_tool is not None and final_tool not in self.tools:
            raise ValueError(f"final_tool {final_tool!r} is not one of the tools {sorted(self.tools)}")
        self.max_turns, self.tool_timeout_s, self.final_tool = max_turns, tool_timeout_s, final_tool
        self.tool_role, self.turn_reward = tool_role, turn_reward
        # Default: the task's own, so every ToolEnv built for a task with per-episode state gets fresh tools.
        self.episode_factory = episode_factory if episode_factory is not None else task.episode
        self.system_prompt = (
            system_prompt if system_prompt is not None else tools_system_prompt(list(self.tools.values()))
        )
        self.replies = ReplyParsers(
            tokenizer,
            tool_parser or task.tool_parser,
            reasoning_parser or task.reasoning_parser,
        )
        # Thinking models (Task.thinking; models/template_check.py): split, each prompt is what the template renders
        # and the episode is split into chains where it drops reasoning; keep, a template that keeps reasoning.
        self.thinking = thinking or task.thinking
        if self.thinking not in THINKING_MODES:
            raise ValueError(f"thinking must be one of {THINKING_MODES}, got {self.thinking!r}")
        fmt = self.replies.reasoning
        self.template: str | None = None  # None: the tokenizer's own
        if check_template or self.thinking == "keep":
            self.template = check_multi_turn_template(tokenizer, self.thinking, tool_role, fmt.start, fmt.end)
        self._kw: dict[str, Any] = {"chat_template": self.template} if self.template is not None else {}
        self.turn_end = turn_end_text(tokenizer, self.template)
        self.opened = opened_text(tokenizer, self.template)
        self.schemas = {name: t.parameters for name, t in self.tools.items()}

    def initial_messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        prompt = row["prompt"]
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if msgs and msgs[0]["role"] == "system":
            msgs[0]["content"] = f"{self.system_prompt}\n\n{msgs[0]['content']}"
        else:
            msgs.insert(0, {"role": "system", "content": self.system_prompt})
        return msgs

    def _next_prompt(
        self, msgs: list[dict[str, Any]], n_new: int, ids: list[int], rendered: str, c: Completion
    ) -> tuple[list[int], str]:
        """The next turn's prompt ids and text, after `n_new` tool messages. The turn's prompt + its sampled ids +
        the env's tokens (the rest of the assistant turn, the tool messages and the generation prompt, from the
        template's text) when the template renders the conversation as an extension of the turn; for a thinking
        model's template (one with a reasoning block) the turn must also be rendered as it was sampled, else (it
        dropped the turn's reasoning) the prompt is the template's own rendering: what a deployment re-rendering the
        history gives the model, and a new chain of the episode (chains_of_turns)."""
        before = self.tok.apply_chat_template(msgs[:-n_new], tokenize=False, **self._kw)
        after = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **self._kw)
        thinking_model = bool(self.replies.reasoning.start)
        if thinking_model and not (after.startswith(before) and before == rendered + c.text + self.turn_end):
            return render_ids(self.tok, msgs, add_generation_prompt=True, chat_template=self.template), after
        if not after.startswith(before):
            i = next((j for j, (a, b) in enumerate(zip(before, after)) if a != b), len(before))
            raise ChatTemplateError(
                f"the chat template of {getattr(self.tok, 'name_or_path', 'this model')!r} "
                f"rewrote earlier turns when a {self.tool_role!r} message was added (first "
                f"difference at char {i}: {before[i : i + 30]!r} -> {after[i : i + 30]!r})"
            )
        sampled = self.tok.decode(c.token_ids, skip_special_tokens=False)
        k = max((k for k in range(len(self.turn_end) + 1) if sampled.endswith(self.turn_end[:k])), default=0)
        bridge = self.turn_end[k:]
        env_ids = list(self.tok(bridge + after[len(before) :], add_special_tokens=False)["input_ids"])
        return ids + list(c.token_ids) + env_ids, after

    async def rollout(self, row: dict[str, Any], sampler: Sampler, params: SampleParams | None = None) -> Trajectory:
        params = params or self.params
        keep = replace(params, keep_prefix=True)  # the next turn extends this one: keep its KV
        episode = self.episode_factory(row) if self.episode_factory is not None else None
        tools = self.tools if episode is None else self._episode_tools(episode)
        msgs = self.initial_messages(row)
        ids = render_ids(self.tok, msgs, add_generation_prompt=True, chat_template=self.template)
        rendered = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **self._kw)
        turns: list[Turn] = []
        calls_log: list[dict[str, Any]] = []
        stats = {
            "tool_calls": 0.0,
            "tool_errors": 0.0,
            "malformed_calls": 0.0,
            "tool_timeouts": 0.0,
            "tool_results_truncated": 0.0,
        }
        turn_bonus, answer = 0.0, ""
        feedback: tuple[str, int] | None = None
        final_call: dict[str, Any] | None = None
        finishing = False
        stop_reason = "max_turns"
        try:
            for k in range(self.max_turns):
                c = await sample_turn(sampler, ids, keep, first=k == 0)
                if c is None:
                    stop_reason = "context"
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
                msgs.append({"role": "assistant", "content": self.opened + c.text})  # as the template renders it
                calls, errors = self._calls(c, ids)
                answer = c.text
                if not calls and not errors:
                    stop_reason = "answer"
                    break
                results: list[ToolResult] = [ToolResult(f"error: malformed tool call: {e}", ok=False) for e in errors]
                stats["malformed_calls"] += len(errors)
                if errors and feedback is None:
                    feedback = (f"turn {k + 1}: malformed tool call: {str(errors[0])[:300]}", k)
                final = None
                for call in calls:
                    calls_log.append(call)
                    stats["tool_calls"] += 1
                    if call["name"] == self.final_tool:
                        final = call
                        break
                    r = await call_tool(tools, call, self.tool_timeout_s)
                    stats["tool_errors"] += not r.ok
                    if not r.ok and feedback is None:  # the first thing that went wrong, and the turn that did it
                        feedback = (
                            f"turn {k + 1}: the call {call['name']}({_short(call.get('arguments'))}) "
                            f"failed: {r.content[:300]}",
                            k,
                        )
                    stats["tool_timeouts"] += r.timed_out
                    results.append(r)
                if self.turn_reward is not None:
                    turn_bonus += float(self.turn_reward(k, c.text, results))
                if final is not None:
                    stop_reason = "final_tool"
                    final_call = final
                    answer = str(next(iter(final["arguments"].values()), "")) if final["arguments"] else ""
                    break
                if k == self.max_turns - 1:
                    break
                msgs += [{"role": self.tool_role, "content": self._shown(r, stats)} for r in results]
                ids, rendered = self._next_prompt(msgs, len(results), ids, rendered, c)
            if stop_reason == "context":
                turns[-1] = replace(turns[-1], finish_reason="length")  # truncated: the episode had more to do
            stats["turns"] = float(len(turns))
            stats["context_stop"] = float(stop_reason == "context")
            turns, other_chains = chains_of_turns(turns)  # more than one where the template dropped reasoning
            stats["chains"] = float(1 + len(other_chains))
            extra: dict[str, Any] = {}
            if episode is not None:
                finishing = True  # from here the episode is finish's to release, whatever happens
                end = await finish_episode(episode, final_call)
                stats.update(end.metrics)
                extra["episode_columns"] = end.columns
        except Exception as e:
            # The rollout raised before its episode finished (a sample failed: envs/isolate.py), and the run goes
            # on: the episode must release what it holds (on an env worker: its state and its slot's count). A
            # lost worker took the episode with it.
            if episode is not None and not finishing and not isinstance(e, EnvWorkerLost):
                await discard_episode(episode)
            raise
        return Trajectory(
            turns=turns,
            extra_chains=other_chains,
            prompt_text=prompt_text(row["prompt"]),
            completion_text=answer,
            row=row,
            metrics={**stats, "turn_reward": turn_bonus},
            extra=extra,
            tool_calls=calls_log,
            messages=msgs[1:],
            feedback=feedback[0] if feedback else None,
            feedback_turn=feedback[1] if feedback else None,
            stop_reason=stop_reason,
        )

    def _calls(self, c: Completion, prompt_ids: list[int]) -> tuple[list[dict[str, Any]], list[str]]:
        """A turn's calls, never read from its reasoning: the `<tool_call>` JSON the system prompt asks for, else the
        model family's own format (`Task.tool_parser`; sampling/reply_parsers.py)."""
        _, text = self.replies.split(c, prompt_ids)
        calls, errors = parse_calls(text)
        if calls or self.replies.tool.name == "hermes":
            return calls, errors
        own = self.replies.tool.parse(text, self.schemas)
        return (own.calls, own.errors) if own.calls else (calls, errors)

    def _shown(self, result: ToolResult, stats: dict[str, float]) -> str:
        """A tool result as the model reads it: at most max_result_chars (a marker says how much was cut),
        tokenizable."""
        text, cut = truncate_text(result.content, self.max_result_chars)
        if cut:
            stats["tool_results_truncated"] += 1
        return tokenizable(text)

    def _episode_tools(self, episode: Any) -> dict[str, Tool]:
        tools = {t.name: t for t in (x if isinstance(x, Tool) else Tool.from_function(x) for x in episode.tools)}
        if set(tools) != set(self.tools):
            raise ValueError(
                f"the episode's tools {sorted(tools)} differ from the env's {sorted(self.tools)}, "
                "which the system prompt lists"
            )
        return tools

    async def score(self, trajectories: list[Trajectory]) -> list[Score]:
        scores = score_with_rubric(
            self.task,
            trajectories,
            lambda t: {"tool_calls": t.tool_calls, "num_turns": len(t.turns), **t.extra.get("episode_columns", {})},
        )
        # the turn rewards the episode's steps gave, added to the rubric's
        return [
            replace(s, reward=s.reward + t.metrics["turn_reward"]) if t.metrics.get("turn_reward") else s
            for t, s in zip(trajectories, scores, strict=True)
        ]


async def sample_turn(sampler: Sampler, ids: list[int], params: SampleParams, first: bool) -> Completion | None:
    """One turn of a multi-turn episode within the sampler's context: its completion, or None when the turn does
    not fit (a context stop: the caller ends the episode). A first prompt that does not fit raises ContextOverflow:
    the sample fails with the numbers. Shared by the multi-turn envs (tool, gym text, OpenEnv)."""
    turn_params = params if first else fit_turn(sampler.context, len(ids), params)
    if turn_params is None:
        return None
    try:
        ((c,),) = await sampler.sample([ids], turn_params, n=1)
    except ContextOverflow:
        if first:
            raise
        return None  # a sampler whose budget is tighter than the one it showed refused the turn
    return c


def fit_turn(budget: ContextBudget | None, prompt_tokens: int, params: SampleParams) -> SampleParams | None:
    """The next turn's params within the episode's context budget: as they are when max_tokens fits, cut to the
    room left under overflow=truncate, None when the turn cannot fit (the episode ends: a context stop)."""
    if budget is None:
        return params
    try:
        fitted = budget.fit(prompt_tokens, params.max_tokens)
    except ContextOverflow:
        return None
    return params if fitted == params.max_tokens else replace(params, max_tokens=fitted)


async def finish_episode(episode: Any, final_call: dict[str, Any] | None) -> EpisodeEnd:
    """The episode's optional `finish(final_call)`, awaited if async, checked to be an EpisodeEnd (None: empty).
    Also run on an env worker (cluster/ray_episodes.py), where the episode lives."""
    finish = getattr(episode, "finish", None)
    if finish is None:
        return EpisodeEnd()
    end = finish(final_call)
    if inspect.isawaitable(end):
        end = await end
    if end is None:
        return EpisodeEnd()
    if not isinstance(end, EpisodeEnd):
        raise TypeError(f"episode.finish must return an EpisodeEnd or None, got {type(end).__name__}")
    return end


_SURROGATE = re.compile("[\ud800-\udfff]")


def tokenizable(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD. A tool may echo what the model wrote, and a `\\ud800` escape
    in a tool call's JSON decodes to a lone surrogate, which no tokenizer encodes (it raised TypeError)."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


async def discard_episode(episode: Any) -> None:
    """The episode's optional `discard()` (sync or async), for an episode that will never finish. What it raises is
    dropped: the rollout's own error is what the caller needs to see."""
    discard = getattr(episode, "discard", None)
    if discard is None:
        return
    try:
        out = discard()
        if inspect.isawaitable(out):
            await out
    except Exception:  # noqa: BLE001 - best effort; the rollout is already failing with its own error
        pass


def _short(args: Any, n: int = 120) -> str:
    text = json.dumps(args, default=str) if not isinstance(args, str) else args
    return text if len(text) <= n else text[: n - 3] + "..."
