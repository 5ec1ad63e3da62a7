"""OpenAI chat messages -> prompt token ids, keeping the policy's own tokens for earlier assistant turns.

Two jobs:

1. `render_chat`: normalize OpenAI-format messages (content parts, `tool_calls` with JSON-string arguments) and
   render them with the tokenizer's chat template, passing `tools` through when the template uses them. For a
   template that ignores tools, the tool list is put in a system message in the Hermes format the model is
   asked to answer in (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), so tools work with any chat
   model (how well depends on the model).

2. `splice_prompt`: when a request continues a conversation the server answered before (same rollout id, the
   earlier messages plus our assistant reply are a prefix of the new messages), the new prompt is built as
   `previous prompt ids + the completion ids the policy sampled + tokens of the new text only`. Re-rendering and
   re-tokenizing the assistant's text would not give back the sampled tokens in general (BPE merges, special
   tokens dropped on decode, text cut at a stop string), and then the turn would break the trajectory's prefix
   contract. When the check fails (the agent edited history), the prompt is rendered fresh and the recorder
   starts a new chain for it (see recorder.py).

Thinking models: an assistant message's `reasoning_content` is kept (the template decides whether it renders it;
its size counts in the request's character limit like content). A reply whose sampled tokens hold a reasoning block
is spliced only when the template renders that block in the next conversation; where the template drops it
(DeepSeek-R1, Qwen3 before the last user query) the prompt is the template's own rendering: a new chain, so no
trained context holds reasoning the model will not see. `ChatRenderer(tok, template, keep_reasoning=True)` renders
with a template that keeps reasoning (Task.thinking "keep", models/template_check.py), each assistant message's
`reasoning_content` written back into its content as the model writes it (`<think>\nR\n</think>\n\n`).
"""

from __future__ import annotations

import json
from typing import Any

from posttrain.bounded import BoundedError, loads_json
from posttrain.sampling.reasoning_parsers import REASONING_PARSERS, detect_reasoning_parser
from posttrain.sampling.recorder import RecordedCall

_SENTINEL = "\u2063posttrain-sentinel\u2063"


def content_text(content: Any) -> str:
    """OpenAI content: a string, None, or a list of parts ({"type": "text", "text": ...})."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    raise ValueError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def _args_dict(args: Any) -> Any:
    """Tool-call arguments a client sent as a JSON string (the model's own call, echoed back), decoded with
    posttrain.bounded's caps; text that is not JSON, or too deep or large, stays the string it was."""
    if isinstance(args, str):
        try:
            return loads_json(args)
        except BoundedError:
            return args
    return args


def normalize_message(m: dict[str, Any], template_has_tools: bool) -> dict[str, Any]:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise ValueError(f"each message needs a string 'role', got {str(m)[:200]}")
    out: dict[str, Any] = {"role": m["role"], "content": content_text(m.get("content"))}
    calls = [c.get("function", c) for c in (m.get("tool_calls") or [])]
    calls = [{"name": c.get("name"), "arguments": _args_dict(c.get("arguments", {}))} for c in calls]
    if calls:
        if template_has_tools:
            out["tool_calls"] = [{"type": "function", "function": c} for c in calls]
        else:  # write them the way the model was asked to emit them
            blocks = "\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls)
            out["content"] = (out["content"] + "\n" + blocks).strip()
    for k in ("name", "tool_call_id"):
        if m.get(k) is not None:
            out[k] = m[k]
    if m["role"] == "assistant" and isinstance(m.get("reasoning_content"), str):
        out["reasoning_content"] = m["reasoning_content"]  # counted in the request's characters (openai_prompts.py)
    return out


def message_key(m: dict[str, Any]) -> tuple:
    """What must be equal for a re-sent message to count as the same message (ignores client-added fields)."""
    calls = [c.get("function", c) for c in (m.get("tool_calls") or [])]
    calls_key = json.dumps([[c.get("name"), _args_dict(c.get("arguments", {}))] for c in calls], sort_keys=True)
    return (m.get("role"), content_text(m.get("content")).strip(), calls_key, m.get("tool_call_id"))


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    specs = "\n".join(json.dumps(t.get("function", t)) for t in tools)
    return (
        "You may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{specs}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within <tool_call>"
        '</tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )


class ChatRenderer:
    def __init__(self, tokenizer: Any, template: str | None = None, keep_reasoning: bool = False):
        """`template`: render with this chat template instead of the tokenizer's; `keep_reasoning`: write each
        assistant message's reasoning_content into its content (see the module docstring)."""
        self.tok = tokenizer
        self.template = template
        if template is None:
            template = getattr(tokenizer, "chat_template", None)
            if isinstance(template, dict):  # some tokenizers keep several named templates
                template = template.get("default") or next(iter(template.values()), None)
        self.has_template = bool(template)
        self.template_has_tools = bool(template) and "tools" in template
        self.reasoning = REASONING_PARSERS[detect_reasoning_parser(str(template or ""))]
        self.keep_reasoning = keep_reasoning

    def text(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        if not self.has_template:
            raise ValueError(
                "this model's tokenizer has no chat template; use /v1/completions with a text or token-id prompt"
            )
        msgs = [normalize_message(m, self.template_has_tools) for m in messages]
        if self.keep_reasoning:
            msgs = [self._inline_reasoning(m) for m in msgs]
        kwargs: dict[str, Any] = {"chat_template": self.template} if self.template is not None else {}
        if tools and self.template_has_tools:
            kwargs["tools"] = [t if "function" in t else {"type": "function", "function": t} for t in tools]
        elif tools:
            sys_text = tools_system_text(tools)
            if msgs and msgs[0]["role"] == "system":
                msgs[0] = {**msgs[0], "content": msgs[0]["content"] + "\n\n" + sys_text}
            else:
                msgs.insert(0, {"role": "system", "content": sys_text})
        return self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)

    def _inline_reasoning(self, m: dict[str, Any]) -> dict[str, Any]:
        """An assistant message with its reasoning_content written at the start of its content, as the model wrote
        it (a template that keeps reasoning then renders the turn as sampled)."""
        r, fmt = m.get("reasoning_content"), self.reasoning
        if m["role"] != "assistant" or not isinstance(r, str) or not fmt.start:
            return m
        out = {k: v for k, v in m.items() if k != "reasoning_content"}
        if fmt.start not in out["content"]:
            out["content"] = f"{fmt.start}\n{r}\n{fmt.end}\n\n{out['content']}"
        return out

    def keeps_reasoning(self, prev: RecordedCall, turn: str) -> bool:
        """Whether `turn` (the template's rendering of `prev`'s reply in the next conversation) keeps the reasoning
        block the reply was sampled with; True for a reply without one."""
        end = self.reasoning.end
        if not end or end not in self.tok.decode(prev.completion_ids, skip_special_tokens=False):
            return True
        reasoning = (prev.reply or {}).get("reasoning_content")
        return end in turn and (not isinstance(reasoning, str) or reasoning in turn)

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tok(text, add_special_tokens=False)["input_ids"]]

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        return self.encode(self.text(messages, tools, add_generation_prompt=True))

    def splice(
        self, prev: RecordedCall, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int] | None:
        """Prompt ids that extend `prev` token for token, or None when `messages` do not continue it."""
        if prev.messages is None or prev.reply is None or (prev.tools or None) != (tools or None):
            return None
        n = len(prev.messages)
        if len(messages) <= n + 1 or messages[n].get("role") != "assistant":
            return None
        if [message_key(m) for m in messages[:n]] != [message_key(m) for m in prev.messages]:
            return None
        if message_key(messages[n]) != message_key(prev.reply):
            return None
        gen = self.text(prev.messages, tools, add_generation_prompt=True)
        head = self.text(messages[: n + 1], tools, add_generation_prompt=False)
        full = self.text(messages, tools, add_generation_prompt=True)
        probe = self.text(
            messages[:n] + [{"role": "assistant", "content": _SENTINEL}], tools, add_generation_prompt=False
        )
        if not (full.startswith(head) and head.startswith(gen) and probe.startswith(gen) and _SENTINEL in probe):
            return None
        if not self.keeps_reasoning(prev, head[len(gen) :]):
            return None  # the template dropped the reply's reasoning: the model is shown the history without it
        tail = probe[probe.index(_SENTINEL) + len(_SENTINEL) :]  # what the template writes after the content
        if not head.endswith(tail):
            return None
        new_ids = self.encode(tail + full[len(head) :])
        # The sampled completion usually ends with the end-of-turn token the template would write again.
        if prev.finish_reason == "stop" and prev.completion_ids and new_ids and new_ids[0] == prev.completion_ids[-1]:
            new_ids = new_ids[1:]
        return list(prev.prompt_ids) + list(prev.completion_ids) + new_ids
