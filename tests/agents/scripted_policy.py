"""A conversation-aware scripted policy for the agent-framework tests (tests/agents/).

`ScriptedPolicy(tok, rules)` is a Sampler (like posttrain.sampling.scripted.ScriptedSampler) whose reply is chosen
from the rendered prompt: the first rule whose predicate holds for the prompt's text answers. So an agent framework
driven against it gets a tool call when it offered tools, a final answer once the tool result is in, JSON when the
test asks for it, whatever order and however many calls the framework makes.

    policy = ScriptedPolicy(tok, [
        Rule(after_tool, "It is sunny in Paris."),
        Rule(offers_tool("get_weather"), tool_call("get_weather", {"city": "Paris"})),
        Rule(always, "Hello!"),
    ])

With `model=...` the scripted tokens are scored under that model (teacher forcing, at the request's temperature):
the logprobs the server records are then the policy's own, so a training step on the episodes sees
train/sampler_logp_abs_diff near 0, as with a real sampler, and the step really updates the model.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.sampling.context import ContextBudget
from posttrain.sampling.hf_sampler import cut_at_stop
from posttrain.types import Completion, SampleParams


@dataclass(frozen=True)
class Prompt:
    """The prompt a rule looks at: its text with special tokens (`<|im_start|>role` markers kept)."""

    text: str

    @property
    def roles(self) -> list[str]:
        """The roles of the messages, in order, without the generation prompt's `assistant`."""
        roles = re.findall(r"<\|im_start\|>(\w+)\n", self.text)
        open_turn = "<|im_end|>" not in self.text.rpartition("<|im_start|>")[2]  # the generation prompt
        return roles[:-1] if roles and open_turn else roles

    @property
    def forced(self) -> str:
        """Text after the generation prompt: the opening the server forces for tool_choice "required" or a named
        function (sampling/tool_parsers.forced_opening), put on the prompt side; the reply continues it."""
        _, sep, tail = self.text.rpartition("<|im_start|>assistant\n")
        return tail if sep and "<|im_end|>" not in tail else ""

    @property
    def last_role(self) -> str | None:
        roles = self.roles
        return roles[-1] if roles else None

    def tool_names(self) -> list[str]:
        """The tools offered in the prompt (the server's Hermes system text lists one JSON spec a line)."""
        block = re.search(r"<tools>\n(.*?)\n</tools>", self.text, flags=re.S)
        if not block:
            return []
        names = []
        for line in block.group(1).splitlines():
            try:
                names.append(json.loads(line).get("name"))
            except (json.JSONDecodeError, AttributeError):
                continue
        return [n for n in names if isinstance(n, str)]


Predicate = Callable[[Prompt], bool]
Reply = str | Callable[[Prompt], str]


@dataclass(frozen=True)
class Rule:
    when: Predicate
    reply: Reply


def always(p: Prompt) -> bool:
    return True


def after_tool(p: Prompt) -> bool:
    """The last message is a tool result: time for the final answer."""
    return p.last_role == "tool"


def has_tools(p: Prompt) -> bool:
    return bool(p.tool_names())


def offers_tool(name: str) -> Predicate:
    return lambda p: name in p.tool_names()


def mentions(text: str) -> Predicate:
    """The last message contains `text` (case-insensitive)."""
    return lambda p: text.lower() in p.text.rsplit("<|im_start|>", 2)[-2].lower() if p.roles else False


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A Hermes tool call, the format the server reads (sampling/tool_parsers.py)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def weather_rules(final: str = "It is sunny in Paris.", plain: str = "Hello from the policy.") -> list[Rule]:
    """The default script: get_weather(city=Paris) when it is offered, `final` after its result, else `plain`."""
    return [
        Rule(after_tool, final),
        Rule(offers_tool("get_weather"), tool_call("get_weather", {"city": "Paris"})),
        Rule(always, plain),
    ]


class ScriptedPolicy:
    """A Sampler that answers each prompt by the first matching rule (see the module docstring). `prompts` keeps
    every prompt's text; `replies` every reply's; `rules` may be replaced between requests (under `lock`)."""

    def __init__(self, tokenizer: Any, rules: list[Rule], model: Any = None, policy_version: int = 0):
        self.tokenizer = tokenizer  # AgentEnv reads the sampler's tokenizer
        self.tok = tokenizer
        self.rules = list(rules)
        self.model = model
        self.policy_version = policy_version
        self.context: ContextBudget | None = None  # no context limit (sampling/base.Sampler: a scripted sampler)
        self.lock = threading.Lock()  # the server runs in a thread of its own; the test thread reads what it saw
        self.prompts: list[str] = []
        self.replies: list[str] = []
        self.constraints: list[Any] = []  # each call's params.constraint (response_format / a forced call's rest)

    def decode(self, token_ids: list[int]) -> str:
        return self.tok.decode(token_ids, skip_special_tokens=True)

    def reply_for(self, prompt: Prompt) -> str:
        with self.lock:
            rules = list(self.rules)
        for rule in rules:
            if rule.when(prompt):
                return rule.reply(prompt) if callable(rule.reply) else rule.reply
        raise AssertionError(f"no rule answers the prompt:\n{prompt.text[-2000:]}")

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        out = []
        for ids in prompts_P:
            prompt = Prompt(self.tok.decode(ids, skip_special_tokens=False))
            text = self.reply_for(prompt)
            if prompt.forced:  # a model continues the forced opening; the script's reply must start with it
                assert text.startswith(prompt.forced), f"the server forced {prompt.forced!r}, the script says {text!r}"
                text = text[len(prompt.forced) :]
            with self.lock:
                self.prompts.append(prompt.text)
                self.replies.append(text)
                self.constraints.append(getattr(params, "constraint", None))
            reply_ids = [int(i) for i in self.tok(text, add_special_tokens=False)["input_ids"]]
            reply_ids.append(int(self.tok.eos_token_id))
            if self.model is not None:  # the model's own logprobs of the scripted tokens (off the event loop)
                logprobs = await asyncio.to_thread(self._logprobs, list(ids), reply_ids, params.temperature)
            else:
                logprobs = [-0.5] * len(reply_ids)
            shown = cut_at_stop(text, params.stop) if params.stop else text
            out.append([Completion(list(reply_ids), list(logprobs), "stop", self.policy_version, text=shown)] * n)
        return out

    def _logprobs(self, prompt_ids: list[int], reply_ids: list[int], temperature: float) -> list[float]:
        import torch

        with torch.no_grad():
            x = torch.tensor([prompt_ids + reply_ids])
            logits = self.model(x).logits[0, len(prompt_ids) - 1 : -1].float() / max(temperature, 1e-4)
            lp = torch.log_softmax(logits, dim=-1)
            return lp.gather(-1, torch.tensor(reply_ids)[:, None])[:, 0].tolist()


def check_one_chain_step(step: Any) -> None:
    """A weather agent's training step (a tool call, then the answer after its result): every episode rewarded,
    its two calls one trained chain, none dropped, the weights moved, the recorded log-probs the trainer's."""
    m = step.metrics
    assert all(t.reward == 1.0 and len(t.turns) == 2 for t in step.trajectories)
    assert m["agent/calls"] == 2 and m["agent/chains"] == 1 and m["agent/dropped_calls"] == 0, m
    assert m["weights/changed"] == 1.0
    assert m["train/sampler_logp_abs_diff"] < 1e-3, m["train/sampler_logp_abs_diff"]
    print({k: m[k] for k in ("agent/chains", "agent/dropped_calls", "train/sampler_logp_abs_diff")})
