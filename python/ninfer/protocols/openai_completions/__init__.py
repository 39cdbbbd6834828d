"""OpenAI legacy Completions (POST /v1/completions)."""
