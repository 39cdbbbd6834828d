"""Turning committed output bytes into protocol text channels."""

from ninfer.outputs.text_decoder import IncrementalTextDecoder

__all__ = ["IncrementalTextDecoder"]
