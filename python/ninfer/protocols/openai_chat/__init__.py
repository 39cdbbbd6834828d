"""OpenAI Chat Completions: wire structs, validation, lowering, and response rendering."""
