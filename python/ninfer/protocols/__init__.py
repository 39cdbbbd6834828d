"""API dialects. Each lowers its requests to one GenerationRequest and renders events back."""
