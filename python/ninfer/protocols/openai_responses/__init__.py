"""OpenAI Responses: typed Items, validation, lowering, rendering, and the local store."""
