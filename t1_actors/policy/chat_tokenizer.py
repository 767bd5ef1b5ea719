"""One tokenizer object for t1's own BPE and for Hugging Face tokenizer directories, chat template included.

    tok = load_tokenizer("run/tokenizer.json")          # t1's own: its template is ``chat_template.render_chat``
    tok = load_tokenizer("path/to/Qwen3")               # HF dir: tokenizer.json + tokenizer_config.json
    ids = tok.encode(text)                              # list[int], no special tokens added
    text = tok.decode(ids)                              # special tokens kept (TITO needs the exact text)
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)

Guarantees:

- A bare ``tokenizer.json`` (t1's own) behaves bit-identically to the ``tokenizers.Tokenizer`` it wraps:
  ``encode``/``decode`` are ``Tokenizer.encode(text, add_special_tokens=False).ids`` and
  ``Tokenizer.decode(ids, skip_special_tokens=False)``; ``apply_chat_template`` is ``render_chat``; ``save``
  writes the same ``tokenizer.json`` ``Tokenizer.save`` writes.
- An HF directory's ``chat_template`` is rendered as ``transformers`` renders it (checked against
  ``PreTrainedTokenizerFast.apply_chat_template`` in tests/test_hf_tokenizer.py): jinja2's
  ``ImmutableSandboxedEnvironment`` with ``trim_blocks``/``lstrip_blocks`` and the ``loopcontrols`` extension,
  transformers' ``tojson`` (no HTML escaping, ``ensure_ascii=False``), ``raise_exception``, ``strftime_now``;
  message keys whose value is None are dropped and ``reasoning``/``thinking`` are aliased to
  ``reasoning_content`` first, and the tokenizer's special tokens (``eos_token`` ...) are template variables.
  Not supported: transformers' ``{% generation %}`` tag (assistant masks) and ``continue_final_message``.
- The added tokens of ``tokenizer.json`` (Qwen3's ``<tool_call>``, ``<think>`` ...) are single ids, so the text
  of sampled ids round-trips through ``decode`` exactly, ``<think>`` blocks included.

``backend_tokenizer`` is the wrapped ``tokenizers.Tokenizer`` (the name transformers' fast tokenizers use),
so ``tito.assemble`` and offset-mapping code take this object directly.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from t1_actors.policy.chat_template import (
    END_OF_TEXT,
    IM_END,
    IM_START,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    render_chat,
)

MARKERS = (END_OF_TEXT, IM_START, IM_END, TOOL_CALL_OPEN, TOOL_CALL_CLOSE, THINK_OPEN, THINK_CLOSE,
           TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run a bash command in the task's sandbox and return its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "the command"}},
                   "required": ["command"]}}}


class ChatTokenizer:
    """A ``tokenizers.Tokenizer`` with its chat template: ``chat_template`` None means t1's own
    (``render_chat``), a string is an HF jinja template. ``special_tokens`` maps transformers' names
    (``eos_token``, ``pad_token`` ...) to token strings; ``config`` is the HF ``tokenizer_config.json``
    as loaded (written back by ``save``)."""

    def __init__(self, backend: Tokenizer, chat_template: str | None = None,
                 special_tokens: dict[str, str] | None = None, config: dict[str, Any] | None = None):
        self.backend_tokenizer = backend
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})
        self.config = config
        self._compiled = _compile(chat_template) if chat_template is not None else None

    # -- ids -------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; no special tokens are added (marker text such as ``<|im_start|>`` maps to its id)."""
        return self.backend_tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """Text of ``ids`` with special tokens kept, so ``encode(decode(ids))`` sees the same markers."""
        return self.backend_tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can emit (added tokens included): a model's vocabulary must cover them."""
        return self.backend_tokenizer.get_vocab_size()

    def token_to_id(self, token: str) -> int | None:
        return self.backend_tokenizer.token_to_id(token)

    def special_token_ids(self) -> dict[str, int]:
        """Id of each chat marker (``<|im_end|>``, ``<tool_call>`` ...) and named special token the tokenizer knows."""
        tokens = [*MARKERS, *self.special_tokens.values()]
        ids = {token: self.token_to_id(token) for token in tokens}
        return {token: i for token, i in ids.items() if i is not None}

    # -- chat ------------------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False,
                            tools: list[dict[str, Any]] | None = None, **kwargs: Any) -> str:
        """Render ``messages`` (``{"role", "content", "tool_calls": [{"name", "arguments"}], ...}``) to text.

        t1's own template takes no ``tools`` or extra variables (it raises rather than ignore them); an HF
        template gets ``tools``, ``add_generation_prompt``, the special tokens and ``kwargs`` (e.g.
        ``enable_thinking=False``), exactly as transformers passes them."""
        if self._compiled is None:
            if tools or kwargs:
                raise ValueError(f"t1's own chat template takes no tools or template variables (got "
                                 f"{sorted([*kwargs, *(['tools'] if tools else [])])}); load an HF tokenizer dir")
            return render_chat(messages, add_generation_prompt=add_generation_prompt)
        if not messages:
            raise ValueError("cannot apply a chat template to an empty conversation")
        chat = [_aliased({k: v for k, v in dict(m).items() if v is not None}) for m in messages]
        variables = {**self.special_tokens, **kwargs}
        return self._compiled.render(messages=chat, tools=tools, documents=None,
                                     add_generation_prompt=add_generation_prompt, **variables)

    # -- files -----------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """t1's own: write ``path`` (a tokenizer.json). HF: write ``path/tokenizer.json`` and
        ``path/tokenizer_config.json`` (the loaded config), a directory ``load_tokenizer`` reads back."""
        path = Path(path)
        if self.config is None:
            self.backend_tokenizer.save(str(path))
            return path
        path.mkdir(parents=True, exist_ok=True)
        self.backend_tokenizer.save(str(path / "tokenizer.json"))
        (path / "tokenizer_config.json").write_text(json.dumps(self.config, indent=2, ensure_ascii=False) + "\n")
        return path

    def __repr__(self) -> str:
        kind = "t1 template" if self.chat_template is None else f"HF template, {len(self.chat_template)} chars"
        return f"ChatTokenizer({self.vocab_size} ids, {kind})"


def load_tokenizer(path: str | Path) -> ChatTokenizer:
    """The one loader: a ``tokenizer.json`` file (t1's own, rendered with ``render_chat``), or a directory.

    A directory with ``tokenizer_config.json`` is an HF tokenizer: its ``chat_template`` (a string, or the
    ``"default"`` entry of a list of named templates, or a ``chat_template.jinja`` beside it) and its special
    tokens are used. A directory with only ``tokenizer.json`` is t1's own. Raises ``FileNotFoundError`` naming
    what is missing, ``ValueError`` for an HF config without a chat template.
    """
    path = Path(path)
    directory = path if path.is_dir() else None
    file = path / "tokenizer.json" if directory else path
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found; pass a tokenizer.json or a directory holding one "
                                "(train one with `python -m t1_actors.policy.tokenizer --out ...`)")
    backend = Tokenizer.from_file(str(file))
    config_file = directory / "tokenizer_config.json" if directory else None
    if config_file is None or not config_file.is_file():
        return ChatTokenizer(backend)
    config = json.loads(config_file.read_text())
    template = _template_of(config, directory)
    special = {key: _token_text(config[key]) for key in SPECIAL_TOKEN_KEYS if config.get(key) is not None}
    return ChatTokenizer(backend, template, special, config)


def as_chat_tokenizer(tokenizer: ChatTokenizer | Tokenizer) -> ChatTokenizer:
    """``tokenizer`` itself, or a bare ``tokenizers.Tokenizer`` (t1's own BPE, e.g. fresh from
    ``train_tokenizer``) wrapped with t1's template."""
    if isinstance(tokenizer, ChatTokenizer):
        return tokenizer
    if isinstance(tokenizer, Tokenizer):
        return ChatTokenizer(tokenizer)
    raise TypeError(f"expected a ChatTokenizer or tokenizers.Tokenizer, got {type(tokenizer).__name__} "
                    "(load one with t1_actors.policy.load_tokenizer)")


def _template_of(config: dict[str, Any], directory: Path) -> str:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {entry["name"]: entry["template"] for entry in template}
        template = named.get("default")
    if template is None and (directory / "chat_template.jinja").is_file():
        template = (directory / "chat_template.jinja").read_text()
    if not isinstance(template, str):
        raise ValueError(f"{directory / 'tokenizer_config.json'} has no chat_template (nor chat_template.jinja)")
    return template


def _token_text(value: Any) -> str:
    return value["content"] if isinstance(value, dict) else str(value)


def _aliased(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
    return message if reasoning is None else {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    return env.from_string(template)
