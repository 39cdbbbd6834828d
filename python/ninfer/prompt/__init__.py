"""Prompt construction: chat-template rendering and tokenization into prompt ids."""

from ninfer.prompt.chat_template import ChatTemplate, TemplateError

__all__ = ["ChatTemplate", "TemplateError"]
