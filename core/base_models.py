"""Base-model profiles: what a model family needs from every stage, chosen from its config.json.

In core because the customer file names a base model and must be refused when a setting
cannot work with its family (`core.training_settings`), before any stage runs; the helpers that
work on a loaded tokenizer or model are in `agent.policies.model_family`.

Why one table: the chat format (how prompts are rendered and replies parsed), the vLLM tool-call
parser, the LoRA targets, the loading options and the context window all follow from the
model's family, and each was once a default written for Llama (Hermes `<tool_call>` blocks,
`gate_proj/up_proj/down_proj`, no quantization). A customer who names a gpt-oss folder as
`training.base_model` must get harmony, the `openai` parser, LoRA on the experts and MXFP4
dequantized for training without setting any of it. The profile is read from the folder's
`config.json` (`model_type`, `quantization_config`, `max_position_embeddings`), never from the
hub, and a folder that is absent (a validating machine without the model) has no profile.

Families:
- `llama` (SmolLM2, Llama): our ChatML template with Hermes tool calls (`chatml_tools.jinja`);
  vLLM parser `hermes` (`llama3_json` for a Llama 3 vocabulary, whose own template emits bare
  JSON calls); LoRA on every linear projection.
- `qwen3`: Hermes `<tool_call>` blocks (Qwen3's own template, `<think>` reasoning); `hermes`.
- `gpt_oss`: harmony (`harmony_tools.jinja`, see it for why ours: several calls per turn, no
  date in the prompt); vLLM parser `openai`; LoRA on attention (q/k/v/o) and on the fused expert
  weights `mlp.experts.gate_up_proj` / `mlp.experts.down_proj` through peft's parameter
  targeting (`LoraConfig.target_parameters`), which needs `lora_dropout` 0; MXFP4 checkpoints are
  dequantized on load (`Mxfp4Config(dequantize=True)`): LoRA trains against dense weights, and
  the MXFP4 kernels give no gradients for the experts.
- anything else: `generic`, the ChatML defaults, no known vLLM parser (serving asks for one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Every linear projection of a Llama/Qwen/SmolLM block; vLLM serves LoRA on exactly these.
LLAMA_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GPT_OSS_EXPERT_PARAMETERS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
GPT_OSS_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", *GPT_OSS_EXPERT_PARAMETERS)
LLAMA3_VOCAB = 128256


@dataclass(frozen=True)
class BaseModelProfile:
    """What the stages need to know about a base model (module docstring)."""

    family: str
    chat_format: str  # "chatml" (Hermes tool calls) or "harmony"
    tool_call_parser: str | None  # vLLM --tool-call-parser; None: unknown, serving must be told
    lora_targets: tuple[str, ...]  # module names and fused parameter names (`lora_config` tells them apart)
    dequantize_mxfp4: bool = False
    context_window: int | None = None
    stop_tokens: tuple[str, ...] = ()  # tokens that end an assistant turn
    lora_dropout: float | None = None  # forced value (parameter targeting has no dropout); None: the settings'

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "chat_format": self.chat_format, "tool_call_parser": self.tool_call_parser,
                "lora_targets": list(self.lora_targets), "dequantize_mxfp4": self.dequantize_mxfp4,
                "context_window": self.context_window, "stop_tokens": list(self.stop_tokens),
                "lora_dropout": self.lora_dropout}


def read_model_config(model_dir: str | Path) -> dict[str, Any] | None:
    """A folder's config.json as a dict; None when the folder has none."""
    path = Path(model_dir).expanduser() / "config.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def profile_from_config(config: dict[str, Any]) -> BaseModelProfile:
    """The profile of a model described by its config.json contents."""
    model_type = str(config.get("model_type") or "")
    window = config.get("max_position_embeddings")
    quant = config.get("quantization_config") or {}
    if model_type == "gpt_oss":
        return BaseModelProfile(
            family="gpt_oss", chat_format="harmony", tool_call_parser="openai", lora_targets=GPT_OSS_LORA_TARGETS,
            dequantize_mxfp4=str(quant.get("quant_method", "")).lower() == "mxfp4", context_window=window,
            stop_tokens=("<|return|>", "<|call|>"), lora_dropout=0.0,
        )
    if model_type.startswith("qwen3") or model_type.startswith("qwen2"):
        return BaseModelProfile(family="qwen3", chat_format="chatml", tool_call_parser="hermes",
                                lora_targets=LLAMA_LORA_TARGETS, context_window=window, stop_tokens=("<|im_end|>",))
    if model_type == "llama":
        parser = "llama3_json" if config.get("vocab_size") == LLAMA3_VOCAB else "hermes"
        return BaseModelProfile(family="llama", chat_format="chatml", tool_call_parser=parser,
                                lora_targets=LLAMA_LORA_TARGETS, context_window=window, stop_tokens=("<|im_end|>",))
    return BaseModelProfile(family="generic", chat_format="chatml", tool_call_parser=None,
                            lora_targets=LLAMA_LORA_TARGETS, context_window=window)


def profile_for(model: str | Path) -> BaseModelProfile | None:
    """The profile of a base model spec (`smollm2`, a folder); None when its folder is not here."""
    text = str(model)
    if text.lower() in ("smollm2", "smollm2-135m-instruct"):
        return BaseModelProfile(family="llama", chat_format="chatml", tool_call_parser="hermes",
                                lora_targets=LLAMA_LORA_TARGETS, context_window=8192, stop_tokens=("<|im_end|>",))
    config = read_model_config(text)
    return profile_from_config(config) if config is not None else None

