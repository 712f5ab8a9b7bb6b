"""Span names and attribute names, in one place.

We reuse the OpenTelemetry GenAI (``gen_ai.*``) and OpenInference (``llm.*``) names where they
exist, so spans exported by any instrumented agent read naturally; ``lightning.*`` names cover only
what those conventions lack (exact token ids, rollout routing, credit-assignment signals).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    # span names
    "SPAN_LLM_CALL",
    "SPAN_TOOL",
    "SPAN_REWARD",
    "SPAN_SIGNAL",
    "SPAN_AGENT",
    "SPAN_ROLLOUT",
    # routing
    "ROLLOUT_ID",
    "ATTEMPT_ID",
    "attributed_ids",
    "ROLE",
    "TRAINABLE",
    # OpenTelemetry GenAI
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_RESPONSE_MODEL",
    "GEN_AI_RESPONSE_ID",
    "GEN_AI_RESPONSE_FINISH_REASONS",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS",
    "GEN_AI_AGENT_NAME",
    "GEN_AI_TOOL_NAME",
    "GEN_AI_TOOL_CALL_ID",
    "GEN_AI_REQUEST_TEMPERATURE",
    "GEN_AI_REQUEST_TOP_P",
    "GEN_AI_REQUEST_MAX_TOKENS",
    # Lightning
    "PROMPT_TOKEN_IDS",
    "RESPONSE_TOKEN_IDS",
    "RESPONSE_LOGPROBS",
    "TOKENS_EXACT",
    "MODEL_VERSION",
    "ADAPTER",
    "ADAPTER_VERSION",
    "CHOICE_INDEX",
    "TOOL_CALLS",
    "TOOL_CALL_PARSE_ERROR",
    "LATENCY_S",
    "REWARD_VALUE",
    "SIGNAL_NAME",
    "SIGNAL_VALUE",
    "TOOL_STATUS",
    "TOOL_ERROR",
    "RESPONSE_TEXT",
    "RESPONSE_CONTENT",
    "GEN_AI_INPUT_MESSAGES",
    "API",
    "STREAM",
    "RESOURCE_ROLLOUT_ID",
    "RESOURCE_ATTEMPT_ID",
    # OpenTelemetry GenAI, as OpenLLMetry records it (read by lightning_rl.capture)
    "GEN_AI_OUTPUT_MESSAGES",
    "GEN_AI_TOOL_DEFINITIONS",
    "GEN_AI_PROMPT",
    "GEN_AI_COMPLETION",
    "GEN_AI_OPERATION_EXECUTE_TOOL",
    "TRACELOOP_SPAN_KIND",
    "TRACELOOP_ENTITY_NAME",
    # OpenInference (read by lightning_rl.capture)
    "OI_SPAN_KIND",
    "OI_INPUT_VALUE",
    "OI_OUTPUT_VALUE",
    "OI_INPUT_MESSAGES",
    "OI_OUTPUT_MESSAGES",
    "OI_MODEL_NAME",
    "OI_TOKEN_COUNT_PROMPT",
    "OI_TOKEN_COUNT_COMPLETION",
    "OI_TOOLS",
    "OI_TOOL_NAME",
    "OI_TOOL_ID",
    "OI_TOOL_CALL_ID",
    "OI_AGENT_NAME",
    "OI_GRAPH_NODE_ID",
    "OI_METADATA",
]

# --- span names -----------------------------------------------------------------------------
SPAN_LLM_CALL: Final = "llm.call"
"""One model call recorded by the gateway, one span per choice."""
SPAN_TOOL: Final = "tool"
"""One tool execution recorded by a plugin (start to end, status ERROR on failure)."""
SPAN_REWARD: Final = "lightning.reward"
"""A reward emitted by the agent with ``emit_reward``; the last one of an attempt is final."""
SPAN_SIGNAL: Final = "lightning.signal"
"""An intermediate-reward input (``emit_signal``), e.g. a tool error, used by AIR."""
SPAN_ROLLOUT: Final = "lightning.rollout"
"""The runner's root span around one agent call."""
SPAN_AGENT: Final = "agent"
"""A framework agent/node run; its role attributes the LLM calls made inside it."""

# --- routing ---------------------------------------------------------------------------------
ROLLOUT_ID: Final = "lightning.rollout_id"
"""The rollout a span belongs to (span or resource attribute in OTLP ingest)."""
ATTEMPT_ID: Final = "lightning.attempt_id"
"""The attempt a span belongs to (span or resource attribute in OTLP ingest)."""
RESOURCE_ROLLOUT_ID: Final = ROLLOUT_ID
RESOURCE_ATTEMPT_ID: Final = ATTEMPT_ID
ROLE: Final = "lightning.role"
"""The agent role that made an LLM call (``X-Lightning-Role`` or a plugin's attribution)."""
TRAINABLE: Final = "lightning.trainable"
"""Whether a plugin marked the role trainable (the adapter's selection may override)."""

# --- OpenTelemetry GenAI semantic conventions ------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"

# --- Lightning additions ---------------------------------------------------------------------
PROMPT_TOKEN_IDS: Final = "lightning.prompt_token_ids"
"""Token ids the engine consumed, exactly (list of int)."""
RESPONSE_TOKEN_IDS: Final = "lightning.response_token_ids"
"""Token ids the engine sampled, exactly (list of int)."""
RESPONSE_LOGPROBS: Final = "lightning.response_logprobs"
"""Log-probability of each sampled token under the sampling distribution (list of float)."""
TOKENS_EXACT: Final = "lightning.tokens_exact"
"""False when token ids were derived from text (an upstream that returns no ids)."""
MODEL_VERSION: Final = "lightning.model_version"
"""The weights version that produced the response."""
ADAPTER: Final = "lightning.adapter"
"""The LoRA adapter that produced the response (per-role adapters); absent: the base weights."""
ADAPTER_VERSION: Final = "lightning.adapter_version"
"""That adapter's version: how many times the engine loaded it (1 for its first weights)."""
CHOICE_INDEX: Final = "lightning.choice_index"
"""Index of the choice when ``n > 1``."""
TOOL_CALLS: Final = "lightning.tool_calls"
"""JSON list of parsed tool calls ``[{"id", "name", "arguments"}]`` in the response."""
TOOL_CALL_PARSE_ERROR: Final = "lightning.tool_call_parse_error"
"""Set when the model emitted a tool call that could not be parsed (returned as content)."""
LATENCY_S: Final = "lightning.latency_s"
REWARD_VALUE: Final = "lightning.reward.value"
SIGNAL_NAME: Final = "lightning.signal.name"
SIGNAL_VALUE: Final = "lightning.signal.value"
TOOL_STATUS: Final = "lightning.tool.status"
"""``ok`` or ``error`` for a tool span."""
TOOL_ERROR: Final = "lightning.tool.error"
RESPONSE_TEXT: Final = "lightning.response_text"
"""Everything the model generated for the choice, tool-call syntax included (decode of the ids)."""
RESPONSE_CONTENT: Final = "lightning.response_content"
"""The message content the client received for the choice (tool-call syntax parsed out; None: none)."""
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
"""The request's messages (chat/responses) or prompt (completions) as JSON."""
API: Final = "lightning.api"
"""Which endpoint served the call: ``chat.completions``, ``completions`` or ``responses``."""
STREAM: Final = "lightning.stream"
"""Whether the call was streamed."""

# --- OpenTelemetry GenAI as OpenLLMetry records it (lightning_rl.capture reads these) ----------
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
"""The response messages as JSON, ``[{"role", "parts": [...], "finish_reason"}]`` (GenAI conventions)."""
GEN_AI_TOOL_DEFINITIONS: Final = "gen_ai.tool.definitions"
"""The tools offered to the model as JSON."""
GEN_AI_PROMPT: Final = "gen_ai.prompt"
"""Prefix of the older flattened messages (``gen_ai.prompt.0.role`` / ``.content``) of OpenLLMetry."""
GEN_AI_COMPLETION: Final = "gen_ai.completion"
"""Prefix of the older flattened responses (``gen_ai.completion.0.content`` / ``.tool_calls.0.name``)."""
GEN_AI_OPERATION_EXECUTE_TOOL: Final = "execute_tool"
"""``gen_ai.operation.name`` of a tool execution span."""
TRACELOOP_SPAN_KIND: Final = "traceloop.span.kind"
"""OpenLLMetry's kind of a decorated span (``workflow``, ``agent``, ``tool``, ``task``)."""
TRACELOOP_ENTITY_NAME: Final = "traceloop.entity.name"
"""The name of an OpenLLMetry-decorated agent or tool."""

# --- OpenInference (lightning_rl.capture reads these) -----------------------------------------
OI_SPAN_KIND: Final = "openinference.span.kind"
"""``LLM``, ``TOOL``, ``AGENT``, ``CHAIN``, ..."""
OI_INPUT_VALUE: Final = "input.value"
OI_OUTPUT_VALUE: Final = "output.value"
OI_INPUT_MESSAGES: Final = "llm.input_messages"
"""Prefix of the flattened request messages: ``llm.input_messages.0.message.role`` / ``.content``."""
OI_OUTPUT_MESSAGES: Final = "llm.output_messages"
OI_MODEL_NAME: Final = "llm.model_name"
OI_TOKEN_COUNT_PROMPT: Final = "llm.token_count.prompt"
OI_TOKEN_COUNT_COMPLETION: Final = "llm.token_count.completion"
OI_TOOLS: Final = "llm.tools"
"""Prefix of the tools offered: ``llm.tools.0.tool.json_schema``."""
OI_TOOL_NAME: Final = "tool.name"
OI_TOOL_ID: Final = "tool.id"
"""The tool-call id a TOOL span answers (when the framework gives it)."""
OI_TOOL_CALL_ID: Final = "tool_call.id"
OI_AGENT_NAME: Final = "agent.name"
OI_GRAPH_NODE_ID: Final = "graph.node.id"
OI_METADATA: Final = "metadata"
"""JSON metadata of a LangChain run (``langgraph_node``, ``lightning_role``, ...)."""


def attributed_ids(*attribute_sets: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """The rollout and attempt ids a span names outside any rollout context: ``ROLLOUT_ID`` and
    ``ATTEMPT_ID`` (non-empty strings) from the first set that has both (the span's attributes, then
    its resource's). The OpenTelemetry span processor and OTLP ingest route spans by it."""
    for attrs in attribute_sets:
        if attrs is None:
            continue
        rollout_id, attempt_id = attrs.get(ROLLOUT_ID), attrs.get(ATTEMPT_ID)
        if isinstance(rollout_id, str) and isinstance(attempt_id, str) and rollout_id and attempt_id:
            return rollout_id, attempt_id
    return None
