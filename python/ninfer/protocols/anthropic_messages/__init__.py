"""Anthropic Messages: wire structs, validation, lowering, and response rendering."""
