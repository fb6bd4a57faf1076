"""Prompt files: shared templates (`*.md`, `string.Template` syntax) and one pack per domain (`<domain>.yaml`).

Prompts live in files so a domain expert can edit them without touching code; `synth.packs`
loads and renders them.
"""
