"""The chat template: system/user/assistant/tool turns and bash tool calls to text, Qwen style.

    <|im_start|>system\\n{system}<|im_end|>\\n
    <|im_start|>user\\n{task}<|im_end|>\\n
    <|im_start|>assistant\\n{thoughts}\\n<tool_call>\\n{call}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{output}\\n</tool_response><|im_end|>\\n

with ``{call}`` the tool call as JSON: ``{"name": "bash", "arguments": {"command": "ls"}}``.

Tool results travel in a user turn wrapped in ``<tool_response>`` (consecutive tool messages share
one turn), as in Qwen3's own template. Rendering is text only: tokenizing the rendered text is the
tokenizer's business, and re-tokenizing a decoded sample need not give back the sampled ids (TITO
repairs that; nothing here makes tokenization canonical).
"""

from __future__ import annotations

import json
import re
from typing import Any

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
GENERATION_PROMPT = f"{IM_START}assistant\n"

_ROLES = ("system", "user", "assistant", "tool")
_TOOL_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


class ToolCallError(ValueError):
    """An assistant turn holds a tool call that cannot be parsed; the message says what is wrong."""


def render_tool_call(call: dict[str, Any]) -> str:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(call.get("arguments"), dict):
        raise ValueError(f"tool call {call!r} must be a dict {{'name': str, 'arguments': dict}}")
    body = json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def render_chat(messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
    """Render chat messages to the model's text; ``add_generation_prompt`` opens an assistant turn.

    A message is ``{"role": "system"|"user"|"assistant"|"tool", "content": str,
    "tool_calls": [{"name": "bash", "arguments": {"command": "..."}}]}`` (tool_calls optional,
    assistant only).
    """
    parts = [render_message(messages, i) for i in range(len(messages))]
    if add_generation_prompt:
        parts.append(GENERATION_PROMPT)
    return "".join(parts)


def render_message(messages: list[dict[str, Any]], i: int) -> str:
    """Message ``i``'s text in ``render_chat``'s rendering: it depends on the message and on whether its
    neighbours are tool messages (consecutive tool outputs share one user turn), nothing else, so a chat that
    grows re-renders only its last message and the new ones (``rollout.prompt.IncrementalRender``)."""
    message = messages[i]
    role, content = _check(message, i)
    if role == "tool":
        opens = i == 0 or messages[i - 1].get("role") != "tool"
        closes = i == len(messages) - 1 or messages[i + 1].get("role") != "tool"
        return (f"{IM_START}user" if opens else "") + f"\n{TOOL_RESPONSE_OPEN}\n{content}\n{TOOL_RESPONSE_CLOSE}" \
            + (f"{IM_END}\n" if closes else "")
    text = content
    if role == "assistant":
        for call in message.get("tool_calls") or []:
            text += ("\n" if text else "") + render_tool_call(call)
    elif message.get("tool_calls"):
        raise ValueError(f"message {i}: only assistant messages carry tool_calls (role is {role!r})")
    return f"{IM_START}{role}\n{text}{IM_END}\n"


def parse_tool_calls(assistant_text: str) -> list[dict[str, Any]]:
    """The tool calls in an assistant turn, in order (``[]`` when there are none).

    Raises ``ToolCallError`` for a call that is unterminated, not JSON, or not
    ``{"name": str, "arguments": dict}``.
    """
    calls = []
    for number, match in enumerate(_TOOL_CALL.finditer(assistant_text)):
        body = match.group(1).strip()
        try:
            call = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ToolCallError(f"tool call {number}: not valid JSON ({exc.msg} at char {exc.pos}): {body[:80]!r}") from None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ToolCallError(f"tool call {number}: expected an object with a string 'name', got {body[:80]!r}")
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # some models emit the arguments JSON-encoded twice
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                raise ToolCallError(f"tool call {number}: 'arguments' is a string that is not JSON") from None
        if not isinstance(arguments, dict):
            raise ToolCallError(f"tool call {number}: 'arguments' must be an object, got {type(arguments).__name__}")
        calls.append({"name": call["name"], "arguments": arguments})
    rest = _TOOL_CALL.sub("", assistant_text)
    if TOOL_CALL_OPEN in rest:
        raise ToolCallError(f"unterminated {TOOL_CALL_OPEN} (no {TOOL_CALL_CLOSE}; generation cut short?)")
    return calls


def _check(message: dict[str, Any], index: int) -> tuple[str, str]:
    if not isinstance(message, dict):
        raise ValueError(f"message {index} must be a dict with 'role' and 'content', got {type(message).__name__}")
    role, content = message.get("role"), message.get("content", "")
    if role not in _ROLES:
        raise ValueError(f"message {index}: role {role!r} is not one of {', '.join(_ROLES)}")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise ValueError(f"message {index}: content must be a string, got {type(content).__name__}")
    return role, content
