"""The harness posttrain runs verifiers' chat seats with (envs/verifiers_env.py): `PosttrainChatHarness`,
verifiers' tool-less chat loop with MCP tools, in process and non-streaming, a trainable seat's calls tagged with
the rollout running (`ROLLOUT_ID`, which VerifiersEnv sets), and its registration as a verifiers plugin
(`register_plugin_module`, done on import). Separate from the env, which only switches seats to this harness and
turns what the server recorded of their calls into a trajectory."""

from __future__ import annotations

import asyncio
import contextvars
import json
import sys
import types
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, cast

import openai
import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.errors import MODEL_TRANSPORT_ERROR_EXIT_CODE
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp
from verifiers.v1.runtimes import ProgramResult

from posttrain.bounded import truncate_text

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

HARNESS_ID = "posttrain_chat"

# The rollout id of the rollout running in this context: the harness tags a trainable seat's calls with it.
ROLLOUT_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("posttrain_verifiers_rollout", default=None)


class PosttrainChatHarnessConfig(vf.HarnessConfig):
    id: str = HARNESS_ID
    max_observation_chars: int = 8000  # of one env message (prompt, user turn, tool result) the model reads
    max_calls: int = 16  # model calls in one segment (a tool loop that never answers ends here)
    request_timeout_s: float = 120.0  # one model call


class PosttrainChatHarness(vf.Harness[PosttrainChatHarnessConfig]):
    """verifiers' tool-less chat loop (`null`) with MCP tools, run in process: verifiers' own runs it as a uv
    script (network to install it) and streams (the posttrain server answers whole). "The interception is the
    contract, not the process" (verifiers.v1.harness): every call goes through `endpoint` with `secret`."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True  # a resumed segment is relaunched on the whole conversation, like `null`
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: Any,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        cfg = self.config
        messages = self._messages(data)
        async with AsyncExitStack() as stack:
            tools, dispatch, servers = await self._tools(mcp_urls, stack)
            client = openai.AsyncOpenAI(
                base_url=endpoint,
                api_key=secret,
                max_retries=0,
                timeout=cfg.request_timeout_s + 5,
                default_headers=_rollout_header(trace),
            )
            stack.push_async_callback(client.close)
            tool_args: dict[str, Any] = {"tools": tools} if tools else {}
            for _ in range(cfg.max_calls):
                try:
                    # The messages are the wire dicts the openai client's message TypedDicts describe.
                    r = await client.chat.completions.create(
                        model=ctx.model, messages=cast("list[ChatCompletionMessageParam]", messages), **tool_args
                    )
                except openai.APIConnectionError as e:  # incl. timeouts: verifiers reads this code as transport
                    return ProgramResult(MODEL_TRANSPORT_ERROR_EXIT_CODE, "", str(e))
                except openai.APIStatusError as e:  # a refused turn (a limit, a @stop) ends the run cleanly
                    return ProgramResult(0 if trace.stop_condition else 1, "", str(e))
                message = r.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    return ProgramResult(0, message.content or "", "")
                for call in message.tool_calls:
                    messages.append(await self._tool_message(call, dispatch, servers))
        return ProgramResult(0, "", "")

    def _messages(self, data: vf.TaskData) -> list[dict[str, Any]]:
        """The conversation to send, every message but the model's own cut to `max_observation_chars` (the same
        cut each call, so the conversation stays a prefix of the next one)."""
        system, prompt = self.resolve_prompt(data)
        msgs = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            msgs.append({"role": "user", "content": prompt})
        else:
            msgs += [message_to_wire(m) for m in prompt or []]
        return [m if m.get("role") == "assistant" else self._bounded(m) for m in msgs]

    def _bounded(self, message: dict[str, Any]) -> dict[str, Any]:
        cap = self.config.max_observation_chars
        content = message.get("content")
        if isinstance(content, str):
            return {**message, "content": truncate_text(content, cap)[0]}
        if isinstance(content, list):
            parts = [
                {**p, "text": truncate_text(p["text"], cap)[0]} if isinstance(p.get("text"), str) else p
                for p in content
                if isinstance(p, dict)
            ]
            return {**message, "content": parts}
        return message

    async def _tools(self, mcp_urls: dict[str, str], stack: AsyncExitStack):
        if not mcp_urls:
            return [], {}, {}
        spec = {"mcpServers": {n: {"url": u, "timeout": self.config.tool_timeout} for n, u in mcp_urls.items()}}
        return await asyncio.wait_for(connect_mcp(spec, stack), self.config.tool_timeout)

    async def _tool_message(self, call: Any, dispatch: dict, servers: dict) -> dict[str, Any]:
        """The tool's result, or the error, as the model reads it back: never an exception out of the loop."""
        function = getattr(call, "function", None)  # a custom (non-function) tool call has none
        name = getattr(function, "name", "") or "?"
        try:
            args = json.loads(getattr(function, "arguments", None) or "{}")
            if name not in dispatch:
                raise ValueError(f"unknown tool {name!r}")
            if not isinstance(args, dict):
                raise ValueError("tool arguments must be a JSON object")
            content = await asyncio.wait_for(call_mcp(servers, dispatch, name, args), self.config.tool_timeout)
        except TimeoutError:
            content = f"error: tool {name!r} took longer than {self.config.tool_timeout}s"
        except Exception as e:  # noqa: BLE001 - a failing tool is an observation for the model
            content = f"error: {type(e).__name__}: {e}"
        return self._bounded({"role": "tool", "tool_call_id": call.id, "name": name, "content": content})


def _rollout_header(trace: vf.Trace) -> dict[str, str]:
    """The server records a call under its X-Rollout-Id; only trainable seats' calls are recorded (a modeled user
    or a judge seat is the env, not the policy being trained)."""
    rid = ROLLOUT_ID.get()
    if rid is None or (trace.agent is not None and not trace.agent.trainable):
        return {}
    return {"X-Rollout-Id": f"{rid}/{trace.id}"}


def register_plugin_module(name: str, *classes: type) -> str:
    """Make `classes` a verifiers plugin named `name` in this process (a module in sys.modules exporting them via
    `__all__`, which is what verifiers' loader imports a taskset, env or harness id as). Returns `name`."""
    module = types.ModuleType(name)
    for cls in classes:
        setattr(module, cls.__name__, cls)
    module.__dict__["__all__"] = [cls.__name__ for cls in classes]  # ModuleType declares no __all__ to assign
    sys.modules[name] = module
    return name


register_plugin_module(HARNESS_ID, PosttrainChatHarness)
