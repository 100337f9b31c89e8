"""/v1/chat/completions input: messages checked, then rendered with the model's chat template.

The template and its rendering (jinja2, sandboxed, as transformers does it) belong to the tokenizer
(asap.model.tokenizer.TextTokenizer.apply_chat_template); this module turns its failures into 400s.
"""
from __future__ import annotations

from asap.server.protocol import ApiError, check_text


class ChatTemplate:
    """The tokenizer's chat template, answering a template's refusal with a 400."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def render(self, messages: list[dict], add_generation_prompt: bool, kwargs: dict) -> str:
        import jinja2
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                      tokenize=False, **kwargs)
        except jinja2.exceptions.TemplateError as e:
            raise ApiError(400, f"the chat template refused these messages: {e}", param="messages") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise ApiError(400, f"the chat template failed on these messages: {type(e).__name__}: {e}",
                           param="messages") from None


def load_chat_template(tokenizer) -> ChatTemplate | None:
    """The model's chat template, or None when it has none (chat requests then get a 400)."""
    if getattr(tokenizer, "chat_template", None) and hasattr(tokenizer, "apply_chat_template"):
        return ChatTemplate(tokenizer)
    return None


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
