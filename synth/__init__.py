"""Synthetic search tasks: generation, verification, distractors, chaining, the cached LLM client."""
