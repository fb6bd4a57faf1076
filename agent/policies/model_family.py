"""What a base model's family needs once it is loaded: its tokenizer prepared, its chat format
told, LoRA targets split into modules and fused parameters, MXFP4 dequantized on load.

The family itself is read from config.json by `core.base_models` (see it for the families).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.base_models import BaseModelProfile

TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATES = {"chatml": "chatml_tools.jinja", "harmony": "harmony_tools.jinja"}


def chat_format_of(tokenizer: Any, model_config: Any = None) -> str:
    """`harmony` for a gpt-oss model or a tokenizer carrying harmony's control tokens, else `chatml`."""
    if str(getattr(model_config, "model_type", "") or "") == "gpt_oss":
        return "harmony"
    vocab = tokenizer.get_vocab()
    return "harmony" if "<|channel|>" in vocab and "<|call|>" in vocab else "chatml"


# Where a harmony answer goes: a forced final reply is begun in the final channel, so the model
# neither reasons at length in `analysis` nor calls a tool before it answers.
FINAL_CHANNEL = {"chatml": "", "harmony": "<|channel|>final<|message|>"}


def reply_opening(chat_format: str, opening: str) -> str:
    """The text appended to a rendered prompt (after the generation prompt) to begin an answer."""
    return FINAL_CHANNEL.get(chat_format, "") + opening


# A turn ends at ChatML's <|im_end|>, or at harmony's <|call|> / <|return|> (never at <|end|>,
# which closes a message inside a turn: an analysis, or one of several tool calls).
TURN_END_MARKERS = {"chatml": ("<|im_end|>",), "harmony": ("<|return|>", "<|call|>")}


def end_of_turn_ids(tokenizer: Any, chat_format: str, first: list[int] | None = None) -> list[int]:
    """The token ids a generated turn stops at: `first` (e.g. the model's generation config), then
    the tokenizer's eos, then the family's end-of-turn markers, each once and in that order (the
    first one is the padding fallback of a tokenizer without a pad token)."""
    ids: list[int] = []
    vocab = tokenizer.get_vocab()
    markers = [vocab.get(marker) for marker in TURN_END_MARKERS.get(chat_format, TURN_END_MARKERS["chatml"])]
    for value in [*(first or []), tokenizer.eos_token_id, *markers]:
        if isinstance(value, int) and value not in ids:
            ids.append(value)
    return ids


def prepare_tokenizer(tokenizer: Any, model_config: Any = None) -> Any:
    """Give a harmony model's tokenizer our harmony template (a gpt-oss folder ships OpenAI's, which
    renders one tool call per turn and today's date); other tokenizers are returned untouched."""
    if chat_format_of(tokenizer, model_config) != "harmony":
        return tokenizer
    ours = (TEMPLATE_DIR / TEMPLATES["harmony"]).read_text(encoding="utf-8")
    current = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    if not current.endswith(ours):  # ours, possibly behind a `set default_reasoning_effort` line
        tokenizer.chat_template = ours
    return tokenizer


def lora_targets(names: Any, model: Any) -> dict[str, Any]:
    """`target_modules` and `target_parameters` for peft's `LoraConfig` from one list of names.

    A name is a parameter target when the model has a parameter whose dotted name ends with it
    and no module does (gpt-oss's fused experts are `nn.Parameter`s, not `nn.Linear`s); a string
    (e.g. `all-linear`) stays a module spec."""
    if isinstance(names, str):
        return {"target_modules": names}
    modules = [n for n, _ in model.named_modules()]
    parameters = [n for n, _ in model.named_parameters()]

    def ends(full: str, name: str) -> bool:
        return full == name or full.endswith("." + name)

    target_modules, target_parameters = [], []
    for name in names:
        if not any(ends(m, name) for m in modules) and any(ends(p, name) for p in parameters):
            target_parameters.append(name)
        else:
            target_modules.append(name)
    out: dict[str, Any] = {"target_modules": target_modules}
    if target_parameters:
        out["target_parameters"] = target_parameters
    return out


def load_options(profile: BaseModelProfile | None) -> dict[str, Any]:
    """Keyword arguments for `AutoModelForCausalLM.from_pretrained` beyond dtype."""
    if profile is None or not profile.dequantize_mxfp4:
        return {}
    from transformers import Mxfp4Config

    return {"quantization_config": Mxfp4Config(dequantize=True)}

