"""The tiny-model kit: a small causal LM and tokenizer built offline, in seconds, as an ordinary HF folder.

Every example and test must run without a download and on a CPU, yet exercise the exact code path a
user's real Hugging Face model takes. So the kit does not fake a model: it trains a byte-level BPE
tokenizer on a small built-in corpus (plus, if given, an agent's own prompt text:
``TinyModelConfig.extra_corpus``) with the ``tokenizers`` library, initialises a Qwen2 (or Llama)
architecture ``transformers`` model at random, and writes both with ``save_pretrained`` together with
a chat template that supports tools. ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load the folder like any checkpoint from the Hub.

The chat format (Qwen-style markers, written for this kit):

- turns are ``<|im_start|>{role}\\n{content}<|im_end|>\\n``; ``<|im_end|>`` is the eos token,
  ``<|endoftext|>`` the pad token;
- tools are listed in the system turn inside ``<tools></tools>``, one compact signature per line,
  ``name(param: type, ...) - description`` (a tiny model has a small context; full JSON schemas
  would triple the prompt of a one-tool agent);
- the assistant calls a tool as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
- a tool result is a turn of role ``tool``.

The model is random: it produces tokens, not sense, until someone trains it (SFT, then RL).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "TinyModelConfig",
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "TOOL_TOKENS",
    "build_tiny_model",
    "default_tiny_model",
    "tiny_corpus",
]

#: Control tokens: never produced by encoding ordinary text, skipped when decoding.
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Tool-syntax markers: single tokens (easy for a small model to learn), but kept when decoding.
TOOL_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<tools>", "</tools>")

# Written for this kit. HF renders templates with trim_blocks/lstrip_blocks, so every literal character is
# emitted from an expression: the output is byte-exact, whatever the whitespace around the tags. The tool-call
# text is the same text the model must produce, so a rendered assistant turn parses back to the same call.
CHAT_TEMPLATE = (
    "{% set ns = namespace(start=0) %}"
    "{% if messages and messages[0].role == 'system' %}{% set ns.start = 1 %}{% endif %}"
    "{% macro text(content) %}"
    "{% if content is string %}{{ content }}"
    "{% elif content is iterable and content is not mapping %}"
    "{% for part in content %}{% if part.text is defined %}{{ part.text }}{% endif %}{% endfor %}"
    "{% endif %}"
    "{% endmacro %}"
    "{% if tools or ns.start == 1 %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% set system = text(messages[0].content) if ns.start == 1 else '' %}"
    "{{ system }}"
    "{% if tools %}"
    "{% if system %}{{ '\\n' }}{% endif %}"
    "{{ '<tools>\\n' }}"
    "{% for tool in tools %}"
    "{% set fn = tool.function if tool.function is defined else tool %}"
    "{{ fn.name ~ '(' }}"
    "{% if fn.parameters is defined and fn.parameters.properties is defined %}"
    "{% for pname, pspec in fn.parameters.properties.items() %}"
    "{% if not loop.first %}{{ ', ' }}{% endif %}"
    "{{ pname }}{% if pspec.type is defined %}{{ ': ' ~ pspec.type }}{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "{{ ')' }}{% if fn.description %}{{ ' - ' ~ fn.description }}{% endif %}{{ '\\n' }}"
    "{% endfor %}"
    "{{ '</tools>' }}"
    "{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages[ns.start:] %}"
    "{{ '<|im_start|>' + message.role + '\\n' }}"
    "{% set content = text(message.content) %}"
    "{{ content }}"
    "{% if message.role == 'assistant' and message.tool_calls %}"
    "{% for call in message.tool_calls %}"
    "{% set fn = call.function if call.function is defined else call %}"
    "{% if loop.index0 > 0 or content %}{{ '\\n' }}{% endif %}"
    "{% set args = fn.arguments if fn.arguments is string else (fn.arguments | tojson) %}"
    "{{ '<tool_call>{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' + args + '}</tool_call>' }}"
    "{% endfor %}"
    "{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelConfig:
    """The knobs of a tiny model. The defaults give about 1.3M parameters: fast enough for RL on a CPU."""

    architecture: Literal["qwen2", "llama"] = "qwen2"
    #: Requested BPE vocabulary size (the trained vocabulary may come out a little smaller).
    vocab_size: int = 2048
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 512
    #: Most tokens (prompt + completion) the model accepts.
    max_context: int = 2048
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    seed: int = 0
    #: Texts the tokenizer also learns from, besides the built-in corpus: an agent's own prompt text
    #: (the instructions its framework wraps every request in). The built-in vocabulary spells words it
    #: does not know letter by letter, so a framework's boilerplate can cost a token per character where
    #: a pretrained tokenizer spends one per word, and every token is computed on every call. Leave
    #: out what the model must learn to copy (names, values): a name that became one token would be
    #: a new, untrained embedding on every question about it.
    extra_corpus: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # a list (from asdict, or a caller's) is hashed and cached like the same tuple
        object.__setattr__(self, "extra_corpus", tuple(self.extra_corpus))

    def key(self) -> str:
        """A short hash naming this configuration (and the kit's format version) for caching."""
        fields = asdict(self)
        if not self.extra_corpus:  # the key of every model built before the field existed stays the same
            del fields["extra_corpus"]
        payload = json.dumps({"kit": _KIT_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


_KIT_VERSION = 2

_WORDS = (
    "the a an and or but if then else when while for to of in on at by with from as is are was were be been "
    "it its this that these those there here what which who whom whose why how where all any each every some "
    "no not yes ok please thanks thank you i we he she they me us him her them my our your their his "
    "can could will would shall should may might must do does did done have has had get got make made "
    "go went come came see saw know knew think thought say said tell told ask asked use used find found "
    "give gave take took call called return returned answer answers question questions result results "
    "number numbers value values sum add added plus minus times divide divided multiply equals total "
    "first second third last next previous one two three four five six seven eight nine ten hundred thousand "
    "tool tools function functions argument arguments name names search query weather city temperature "
    "calculator expression compute computed evaluate step steps reason because so therefore final "
    "user assistant system message messages content text word words list item items time date day today "
    "good bad right wrong true false null none error errors fix task tasks agent agents reward model "
    "hello world data file files code read write open close start stop end begin new old big small "
    "more less most least many much few other same different order count letter letters string"
).split()

_SAMPLE_TOOLS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "For example 12 * (3 + 4)."}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web for a query.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
    },
)


def tiny_corpus(seed: int = 0) -> list[str]:
    """The built-in corpus the tokenizer is trained on: English words, numbers, arithmetic, JSON and the
    chat and tool markers, generated deterministically from ``seed``."""
    import random

    rng = random.Random(seed)
    lines: list[str] = []
    words = list(_WORDS)
    for _ in range(1500):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
        lines.append(sentence.capitalize() + rng.choice([".", "?", "!", ":", ","]))
    for n in range(0, 1000):
        lines.append(f"{n} {n * 7 % 1000} {n / 4} -{n} {n:03d}")
    ops = ["+", "-", "*", "/"]
    for _ in range(1500):
        a, b, op = rng.randint(0, 999), rng.randint(1, 999), rng.choice(ops)
        lines.append(f"What is {a} {op} {b}? ({a}{op}{b}) = {a} {op} {b}")
        call = {"name": "calculator", "arguments": {"expression": f"{a} {op} {b}"}}
        lines.append(f"<tool_call>{json.dumps(call)}</tool_call>")
        lines.append(json.dumps({"result": a + b, "ok": rng.random() < 0.5, "error": None, "items": [a, b]}))
    for _ in range(300):
        query = " ".join(rng.choice(words) for _ in range(rng.randint(1, 4)))
        call = {"name": "search", "arguments": {"query": query, "limit": rng.randint(1, 10)}}
        lines.append(f"<tool_call>{json.dumps(call)}</tool_call>")
    for tool in _SAMPLE_TOOLS:
        lines.extend([json.dumps(tool)] * 20)
    for _ in range(200):
        user = " ".join(rng.choice(words) for _ in range(rng.randint(3, 10)))
        lines.append(f"<|im_start|>user\n{user}?<|im_end|>\n<|im_start|>assistant\n{user}.<|im_end|>\n")
    lines.extend(["{}", "[]", '{"": ""}', "\t", "    ", "\n\n", "'\"`~!@#$%^&*()_-=[]{}|\\;:<>,./?"] * 20)
    return lines


def _pipeline() -> tuple[Any, Any]:
    """The normaliser and pre-tokeniser to train with: those ``AutoTokenizer`` will rebuild on load.

    transformers 5 loads a ``qwen2`` folder with ``Qwen2Tokenizer``, which rebuilds its own pipeline
    (NFC, a digit-splitting regex, byte-level) around the saved vocabulary; training under any other
    pipeline would give merges the loaded tokenizer never applies. Older versions load ``tokenizer.json``
    as saved, so a plain byte-level pipeline is consistent there.
    """
    from tokenizers import pre_tokenizers

    try:
        from transformers import Qwen2Tokenizer

        backend = Qwen2Tokenizer().backend_tokenizer
        return backend.normalizer, backend.pre_tokenizer
    except (ImportError, TypeError, ValueError, OSError):
        return None, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _train_tokenizer(config: TinyModelConfig) -> Any:
    """Train a byte-level BPE (every byte is in the alphabet, so any text round-trips)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    normalizer, pre_tokenizer = _pipeline()
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([*tiny_corpus(config.seed), *config.extra_corpus], trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tokenizer


def _hf_tokenizer(config: TinyModelConfig) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(config),
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=config.max_context,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )


def _check_reload(folder: Path, built: Any) -> None:
    """Fail loudly if ``AutoTokenizer`` would load a tokenizer that encodes differently from the one built."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(folder)
    sample = "\n".join(tiny_corpus(1)[::400]) + ' <|im_start|>user\n<tool_call>{"x": 1}</tool_call><|im_end|>'
    if (
        loaded.encode(sample, add_special_tokens=False) != built.encode(sample, add_special_tokens=False)
        or loaded.eos_token != built.eos_token
        or loaded.pad_token != built.pad_token
    ):
        raise RuntimeError(
            f"AutoTokenizer loads the tiny tokenizer in {folder} as {type(loaded).__name__}, which encodes "
            "differently from the tokenizer that was trained; this transformers version is not supported by the "
            "tiny-model kit (please report it)"
        )


def _model(config: TinyModelConfig, vocab_size: int, pad_id: int, eos_id: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": config.hidden,
        "intermediate_size": config.intermediate,
        "num_hidden_layers": config.layers,
        "num_attention_heads": config.heads,
        "num_key_value_heads": config.kv_heads,
        "max_position_embeddings": config.max_context,
        "tie_word_embeddings": config.tie_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "pad_token_id": pad_id,
        "eos_token_id": eos_id,
        "bos_token_id": None,
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        if config.architecture == "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(**common))
        elif config.architecture == "llama":
            model = LlamaForCausalLM(LlamaConfig(**common))
        else:
            raise ValueError(f"unknown tiny architecture {config.architecture!r}: use 'qwen2' or 'llama'")
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    model.generation_config.bos_token_id = None
    return model


def build_tiny_model(path: str | os.PathLike[str], config: TinyModelConfig | None = None, **overrides: Any) -> Path:
    """Build a tiny random model + trained tokenizer and save them as an HF folder at ``path``.

    Args:
        path: The folder to write (created; existing files with the same names are overwritten).
        config: The model's knobs; keyword ``overrides`` (``seed=``, ``vocab_size=``, ``hidden=``,
            ``layers=`` …, see ``TinyModelConfig``) replace single fields.

    Returns:
        The folder, ready for ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``
        or ``TransformersEngine.from_pretrained``.
    """
    config = TinyModelConfig(**{**asdict(config or TinyModelConfig()), **overrides})
    if config.hidden % config.heads or config.heads % config.kv_heads:
        raise ValueError(
            f"hidden ({config.hidden}) must be divisible by heads ({config.heads}) and heads by kv_heads "
            f"({config.kv_heads}); pick compatible sizes"
        )
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _hf_tokenizer(config)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    model = _model(config, len(tokenizer), pad_id, eos_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _check_reload(out, tokenizer)
    (out / "lightning_tiny.json").write_text(json.dumps({"kit": _KIT_VERSION, **asdict(config)}, indent=2))
    return out


def default_tiny_model(cache_dir: str | os.PathLike[str] | None = None, **overrides: Any) -> Path:
    """The tiny model for ``overrides`` (see ``TinyModelConfig``), built once and cached by config hash.

    The cache folder defaults to ``$LIGHTNING_CACHE`` or ``~/.cache/lightning-rl``. Building goes to a
    temporary folder that is renamed into place, so concurrent processes never see a half-written model.
    """
    config = TinyModelConfig(**overrides)
    root = Path(cache_dir or os.environ.get("LIGHTNING_CACHE") or Path.home() / ".cache" / "lightning-rl")
    target = root / f"tiny-{config.key()}"
    if (target / "lightning_tiny.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=root))
    try:
        build_tiny_model(staging, config)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "lightning_tiny.json").exists():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
