"""Promotion gate, vLLM launcher and LoRA loading, the search service."""
