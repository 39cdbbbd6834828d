"""NInfer: a local LLM inference server with OpenAI- and Anthropic-compatible APIs."""

__version__ = "0.1.0"
