"""Tools for ToolEnv: plain Python functions whose type hints and docstrings become JSON schemas, a tool-call
parser (`<tool_call>{json}</tool_call>`, Hermes/Qwen style, with a bare-JSON fallback), and calls with a timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.bounded import BoundedError, loads_json
from posttrain.sampling.tool_calls import parse_tool_calls

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _schema_for(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    if origin in (list, tuple):
        args = typing.get_args(annotation)
        return {"type": "array", **({"items": _schema_for(args[0])} if args else {})}
    if origin is dict:
        return {"type": "object"}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(annotation))}
    return {}


def _param_docs(doc: str) -> dict[str, str]:
    """'name: text' lines of an Args: section (Google style)."""
    out = {}
    for line in doc.splitlines():
        m = re.match(r"\s+(\w+)\s*(?:\([^)]*\))?:\s*(.+)", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


@dataclass
class Tool:
    name: str
    func: Callable[..., Any]
    description: str
    parameters: dict[str, Any]
    required: list[str] = field(default_factory=list)

    @classmethod
    def from_function(cls, func: Callable[..., Any], name: str | None = None) -> Tool:
        doc = inspect.getdoc(func) or ""
        hints = typing.get_type_hints(func)
        sig = inspect.signature(func)
        pdocs = _param_docs(doc)
        props, required = {}, []
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            s = _schema_for(hints.get(p.name, str))
            if p.name in pdocs:
                s["description"] = pdocs[p.name]
            props[p.name] = s
            if p.default is p.empty:
                required.append(p.name)
        return cls(
            name=name or func.__name__,
            func=func,
            description=doc.split("\n\n")[0].strip(),
            parameters={"type": "object", "properties": props, "required": required},
            required=required,
        )

    def schema(self) -> dict[str, Any]:
        """OpenAI function-tool schema."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def _bare_json(text: str) -> str | None:
    """From the first `{` to the last `}` (the regex `\\{.*\\}` with DOTALL, found with str.find and str.rfind:
    that regex re-scans to the end from every `{` when no `}` follows, quadratic in a reply of braces)."""
    start, end = text.find("{"), text.rfind("}")
    return text[start : end + 1] if 0 <= start < end else None


def parse_calls(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Tool calls in a completion: `<tool_call>` blocks, else one bare JSON object with "name" and "arguments"."""
    _, calls, errors = parse_tool_calls(text)
    if calls or errors or "<tool_call>" in text:
        return calls, errors
    candidate = _bare_json(text)
    if candidate is not None:
        try:
            obj = loads_json(candidate)
        except BoundedError:  # invalid, too deep or too large: not a call
            return [], []
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get("arguments"), dict):
            return [{"name": obj["name"], "arguments": obj["arguments"]}], []
    return [], []


# Sync tools that ran past their timeout and are still running. Python cannot kill a thread, so each one is
# abandoned; past this many at once, new sync calls are refused (an error the model reads) instead of started, so
# a tool the policy can make hang cannot pile up threads, and what they hold, for the rest of the run.
MAX_HUNG_TOOL_THREADS = 8
_hung: set[threading.Thread] = set()
_hung_lock = threading.Lock()


def hung_tool_threads() -> int:
    """Abandoned sync tool calls still running now."""
    with _hung_lock:
        _hung.difference_update([t for t in _hung if not t.is_alive()])
        return len(_hung)


def _in_daemon_thread(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[asyncio.Future, threading.Thread]:
    """Run a sync tool in a daemon thread. Unlike asyncio.to_thread, a tool that hangs past its timeout holds
    up neither asyncio.run's shutdown nor the interpreter's exit."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if not fut.done():
            fut.set_exception(exc) if exc is not None else fut.set_result(value)

    def runner() -> None:
        try:
            value, exc = fn(**kwargs), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            value, exc = None, e
        try:
            loop.call_soon_threadsafe(settle, value, exc)
        except RuntimeError:  # the loop closed while the tool ran past its timeout
            pass

    thread = threading.Thread(target=runner, daemon=True, name=f"tool-{getattr(fn, '__name__', 'fn')}")
    thread.start()
    return fut, thread


class ToolError(Exception):
    """Raise from a tool for a mistake the model should read and fix (a bad path, an ambiguous edit): the call
    comes back as "error: <tool>: <message>" and counts as a tool error, without an exception type name."""


class EnvWorkerLost(Exception):
    """The process that held an episode's tools is gone (an env worker died or hung: cluster/ray_episodes.py).
    Not the model's mistake, so call_tool raises it instead of showing it to the model, and the episode runs
    again from its start on a live worker."""


@dataclass
class ToolResult:
    content: str
    ok: bool
    timed_out: bool = False


async def call_tool(tools: dict[str, Tool], call: dict[str, Any], timeout_s: float) -> ToolResult:
    """Run one call. Unknown tools, bad arguments, exceptions and timeouts become error text for the model; they
    never raise (only EnvWorkerLost does: the tool's process died, which the model did not cause). A sync tool
    runs in a thread (Python cannot kill it on timeout: it is abandoned and counted, and while
    MAX_HUNG_TOOL_THREADS are still running new sync calls are refused instead of started)."""
    tool = tools.get(call["name"])
    if tool is None:
        return ToolResult(f"error: unknown tool {call['name']!r}; available: {', '.join(sorted(tools))}", ok=False)
    args = call.get("arguments") or {}
    missing = [r for r in tool.required if r not in args]
    unknown = [a for a in args if a not in tool.parameters["properties"]]
    if missing or unknown:
        return ToolResult(
            f"error: {tool.name} takes {sorted(tool.parameters['properties'])}; missing {missing}, unknown {unknown}",
            ok=False,
        )
    thread: threading.Thread | None = None
    try:
        if inspect.iscoroutinefunction(tool.func):
            out = await asyncio.wait_for(tool.func(**args), timeout_s)
        else:
            if hung_tool_threads() >= MAX_HUNG_TOOL_THREADS:
                return ToolResult(
                    f"error: {tool.name} not run: {MAX_HUNG_TOOL_THREADS} earlier tool calls are still "
                    "running past their timeout",
                    ok=False,
                    timed_out=True,
                )
            fut, thread = _in_daemon_thread(tool.func, args)
            out = await asyncio.wait_for(fut, timeout_s)
    except TimeoutError:
        if thread is not None and thread.is_alive():
            with _hung_lock:
                _hung.add(thread)
        return ToolResult(f"error: {tool.name} timed out after {timeout_s:g}s", ok=False, timed_out=True)
    except ToolError as e:
        return ToolResult(f"error: {tool.name}: {e}", ok=False)
    except EnvWorkerLost:
        raise
    except Exception as e:  # noqa: BLE001 - a tool's failure is the model's observation, not a crash
        return ToolResult(f"error: {tool.name} raised {type(e).__name__}: {e}", ok=False)
    return ToolResult(out if isinstance(out, str) else json.dumps(out, default=str), ok=True)


def tools_system_prompt(tools: list[Tool]) -> str:
    """Instructions + schemas, for chat templates that do not render `tools` themselves."""
    specs = "\n".join(json.dumps(t.schema()["function"]) for t in tools)
    return (
        "You can call tools. To call one, reply with exactly\n"
        '<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>\n'
        f"Tools:\n{specs}"
    )
