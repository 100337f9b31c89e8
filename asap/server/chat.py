"""/v1/chat/completions input: messages checked, then rendered with the model's chat template.

The template is the tokenizer's `chat_template` attribute when it has one, else `chat_template.jinja`
or tokenizer_config.json's `chat_template` in the model dir. It is rendered as Hugging Face renders
it: a sandboxed jinja2 environment with trim_blocks / lstrip_blocks, `raise_exception`, `strftime_now`,
a `tojson` that keeps non-ASCII, and the special tokens (bos_token, eos_token, ...) as variables.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from asap.server.protocol import ApiError, check_text

_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class ChatTemplate:
    def __init__(self, source: str, special: dict[str, str]):
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(source)
        self._jinja2 = jinja2
        self.special = special

    def render(self, messages: list[dict], add_generation_prompt: bool, kwargs: dict) -> str:
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **self.special, **kwargs)
        except self._jinja2.exceptions.TemplateError as e:
            raise ApiError(400, f"the chat template refused these messages: {e}", param="messages") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise ApiError(400, f"the chat template failed on these messages: {type(e).__name__}: {e}",
                           param="messages") from None


def load_chat_template(model_dir, tokenizer=None) -> ChatTemplate | None:
    """The model's chat template, or None when it has none (chat requests then get a 400)."""
    config = {}
    try:
        config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        pass
    config = config if isinstance(config, dict) else {}
    source = getattr(tokenizer, "chat_template", None)
    jinja_file = Path(model_dir) / "chat_template.jinja"
    if not source and jinja_file.is_file():
        source = jinja_file.read_text()
    source = source or config.get("chat_template")
    if isinstance(source, list):          # HF's named templates: use "default"
        source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(source, str) or not source:
        return None
    special = {}
    for name in _SPECIAL:
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            special[name] = value
    return ChatTemplate(source, special)


def check_messages(messages) -> list[dict]:
    """OpenAI messages -> plain dicts for the template (text parts joined); 400 on anything else."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "`messages` must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string `role`", param="messages")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ApiError(400, f"messages[{i}].content: only text parts are supported", param="messages")
                parts.append(part["text"])
            content = "\n".join(parts)
        if content is not None and not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", param="messages")
        msg = {k: v for k, v in m.items() if isinstance(k, str)}
        msg["role"], msg["content"] = check_text(m["role"], "messages"), check_text(content or "", "messages")
        out.append(msg)
    return out
