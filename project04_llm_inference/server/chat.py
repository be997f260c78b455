"""Chat messages -> prompt token ids.

With a `chat_template` in the model folder's `tokenizer_config.json`, the template is rendered
with jinja2 in a sandbox (the variables Hugging Face templates expect: `messages`,
`add_generation_prompt`, `bos_token`, `eos_token`, `raise_exception`, `strftime_now`) and the
text is tokenized without adding special tokens (the template writes them).

Without one, the fallback is plain text, one line per message and an open assistant turn,
tokenized with the tokenizer's special tokens (its BOS):

    system: You are terse.
    user: Hello
    assistant:
"""

from __future__ import annotations

import datetime
import json

from ..model.tokenizer import Tokenizer


class ChatTemplateError(ValueError):
    """The messages could not be rendered (a bad message, or the template refused them)."""


def _special(value) -> str:
    if isinstance(value, dict):  # {"content": "<s>", "lstrip": false, ...}
        return str(value.get("content", ""))
    return "" if value is None else str(value)


class ChatFormatter:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        cfg = tokenizer.config
        source = cfg.get("chat_template")
        if isinstance(source, list):  # named templates: [{"name": "default", "template": ...}]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        self.template = None
        if source:
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
            )
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
            try:
                self.template = env.from_string(source)
            except TemplateError as e:
                raise ValueError(
                    f"tokenizer_config.json chat_template does not compile: {e}"
                ) from None
        self.bos_token = _special(cfg.get("bos_token"))
        self.eos_token = _special(cfg.get("eos_token"))

    def render(self, messages: list[dict], tools: list | None = None) -> str:
        """The prompt text; `tools` (OpenAI's function tools) go to the template as `tools`,
        and to the plain-text fallback as a first `tools:` line of their JSON."""
        if self.template is None:
            lines = [f"{m['role']}: {m['content']}" for m in messages]
            if tools:
                lines.insert(0, "tools: " + json.dumps(tools))
            return "\n".join([*lines, "assistant:"])
        from jinja2 import TemplateError

        try:
            return self.template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as e:
            raise ChatTemplateError(f"the chat template refused the messages: {e}") from None

    def encode(
        self, messages: list[dict], max_chars: int | None = None, tools: list | None = None
    ) -> list[int]:
        """The rendered prompt's token ids; a ChatTemplateError when the rendered text has more
        than max_chars characters (checked before tokenizing it)."""
        text = self.render(messages, tools)
        if max_chars is not None and len(text) > max_chars:
            raise ChatTemplateError(
                f"the rendered prompt has {len(text)} characters, more than the {max_chars} "
                "this server tokenizes"
            )
        return self.tokenizer.encode(text, add_special_tokens=self.template is None)


def _tojson(value, indent=None, ensure_ascii=False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _raise(message: str):
    from jinja2 import TemplateError

    raise TemplateError(message)
