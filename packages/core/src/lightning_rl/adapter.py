"""Spans of one attempt -> ordered transitions, one per LLM call of a trainable role.

The gateway's ``llm.call`` spans carry the exact token ids, so a transition is never rebuilt from
text. Roles come from the span itself (the gateway saw an ``X-Lightning-Role`` header or a
role-specific URL) or from a plugin span joined on the response id — never from timestamps.

Signals for automatic intermediate rewards (AIR) come from ``lightning.signal`` spans and from
plugin ``tool`` spans; each attaches to the call whose response requested that tool (joined on
the tool-call id), or, when the framework gave no id, to the latest call of the same role that had
ended when the tool started (the gateway and the agent's process write spans through different
writers, so store order says nothing about which came first; the clock does).
Signals are attached before untrainable calls are dropped, so a tool requested by an untrainable
role never leaks reward onto a trainable one.

Calls the gateway did not serve (a hosted model) reach the attempt as the spans of the standard
OpenTelemetry instrumentations, OpenLLMetry or OpenInference (``lightning_rl.capture``). They become
*text-level* transitions: ``text`` holds the messages, the response and its tool calls, the token
ids are empty and ``exact_tokens`` is False (``lightning_rl.capture.retokenize`` builds ids with the
policy's tokenizer for RL; SFT and APO read the text). A captured call the gateway also recorded
(same response id) is not counted twice: the gateway's exact transition stays and takes the role
the framework named. Tool spans of those instrumentations feed AIR like a plugin's tool spans; when
they carry no tool-call id they attach to the latest earlier call that asked for a tool of that name.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lightning_rl import semconv
from lightning_rl.capture._convert import CapturedCall, captured_calls, captured_tools, normalize_messages
from lightning_rl.capture._convert import normalize_tool_calls as _normalize_tool_calls
from lightning_rl.roles import RoleSelector, RoleSpec
from lightning_rl.types import Rollout, Span, Transition, TransitionText

__all__ = ["Signal", "AIRPolicy", "air_policy", "AdaptedAttempt", "adapt_attempt", "final_reward"]

log = logging.getLogger(__name__)

AIRPolicy = Mapping[str, float | Callable[["Signal"], float]]
"""Signal name -> intermediate reward: a constant weight times the signal's value (tool events have
value 1, so ``{"tool_error": -0.1}`` costs 0.1 per failed tool call) or a function of the signal
(``{"sql_rows": lambda s: 0.1 * min(s.value, 1)}``). A key ``"tool_error:<tool name>"`` overrides
``"tool_error"`` for that tool. ``"tool_error_recovered"`` (and ``"tool_error_recovered:<tool name>"``)
weighs a failed tool call that the same role followed, later in the attempt, with a successful call
of the same tool: a lookup of a misspelt name answered by a suggestion, then retried, is how a good
agent works, and charging it like a dead end teaches the agent to avoid the tool. Without that key
a recovered error weighs as any other. Signals the policy does not name contribute nothing."""


def air_policy(
    *,
    tool_error: float = -0.1,
    tool_success: float = 0.0,
    per_tool: Mapping[str, float] | None = None,
    tool_error_recovered: float | None = None,
    **signals: float | Callable[[Signal], float],
) -> dict[str, float | Callable[[Signal], float]]:
    """Build an AIR policy: a reward per failed / successful tool call plus any custom signals.

    ``per_tool`` gives a tool its own error reward (``{"execute_sql": -0.2}``);
    ``tool_error_recovered`` weighs a failed call the role then got right with the same tool (``None``:
    as ``tool_error``; see ``AIRPolicy``); extra keyword arguments weigh signals emitted with
    ``emit_signal(name, value)``.
    """
    policy: dict[str, float | Callable[[Signal], float]] = {"tool_error": tool_error, "tool_success": tool_success}
    if tool_error_recovered is not None:
        policy["tool_error_recovered"] = tool_error_recovered
    for tool, weight in (per_tool or {}).items():
        policy[f"tool_error:{tool}"] = weight
    policy.update(signals)
    return policy


@dataclass(frozen=True)
class Signal:
    """An intermediate-reward input observed during the attempt."""

    name: str
    value: float
    tool_call_id: str | None
    role: str | None
    order: int
    """When the signal happened (the span's start, ns): orders it against calls that have no id link."""
    span_id: str
    tool: str | None = None
    recovered: bool = False
    """A ``tool_error`` that the same role followed with a ``tool_success`` of the same tool (see ``AIRPolicy``)."""


@dataclass
class AdaptedAttempt:
    """Transitions of one attempt plus what the adapter noticed, for metrics."""

    transitions: list[Transition]
    signals: list[Signal]
    n_calls: int = 0
    n_untrainable: int = 0
    n_inexact: int = 0
    n_truncated: int = 0
    unattached_signals: list[Signal] = field(default_factory=list[Signal])


def final_reward(rollout: Rollout, spans: Sequence[Span]) -> float | None:
    """The rollout's reward: what the attempt reported, else the last ``emit_reward`` span."""
    if rollout.final_reward is not None:
        return rollout.final_reward
    rewards = [s for s in spans if s.name == semconv.SPAN_REWARD and semconv.REWARD_VALUE in s.attributes]
    if not rewards:
        return None
    return float(max(rewards, key=lambda s: (s.start_ns, s.seq)).attributes[semconv.REWARD_VALUE])


def _ints(value: Any, what: str, span: Span) -> list[int]:
    if not isinstance(value, list):
        raise ValueError(f"llm.call span {span.span_id} has no {what} list; was it recorded by the Lightning gateway?")
    return [int(v) for v in value]  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]


def _tool_call_ids(span: Span) -> list[str]:
    raw = span.attributes.get(semconv.TOOL_CALLS)
    if not raw:
        return []
    calls: Any = json.loads(raw) if isinstance(raw, str) else raw
    return [str(c["id"]) for c in calls if isinstance(c, dict) and c.get("id")]  # pyright: ignore[reportUnknownVariableType]


def _gateway_text(attrs: Mapping[str, Any]) -> TransitionText:
    """The text of a gateway call, in the shape a captured call has (so both compare equal)."""
    raw_inputs = attrs.get(semconv.GEN_AI_INPUT_MESSAGES)
    inputs: Any = raw_inputs
    if isinstance(raw_inputs, str):
        try:
            inputs = json.loads(raw_inputs)
        except ValueError:
            inputs = raw_inputs
    messages = normalize_messages(inputs) if isinstance(inputs, list) else []
    if isinstance(inputs, str):  # a completions prompt or a plain Responses input
        messages = [{"role": "user", "content": inputs}]
    raw_calls = attrs.get(semconv.TOOL_CALLS)
    calls = _normalize_tool_calls(json.loads(raw_calls) if isinstance(raw_calls, str) else raw_calls)
    if semconv.RESPONSE_CONTENT in attrs:
        content = attrs.get(semconv.RESPONSE_CONTENT) or ""
    else:  # recorded before the gateway kept the content: the generated text is it unless tools were called
        content = "" if calls else attrs.get(semconv.RESPONSE_TEXT, "")
    return TransitionText(
        messages=messages,
        response=str(content),
        tool_calls=calls,
        model=attrs.get(semconv.GEN_AI_RESPONSE_MODEL),
        response_id=attrs.get(semconv.GEN_AI_RESPONSE_ID),
        input_tokens=attrs.get(semconv.GEN_AI_USAGE_INPUT_TOKENS),
        output_tokens=attrs.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS),
        source="gateway",
    )


def _captured_transition(call: CapturedCall, rollout: Rollout, attempt_id: str) -> Transition:
    """A text-level transition: no token ids (``exact_tokens`` False), the text in ``text``."""
    return Transition(
        prompt_ids=[],
        response_ids=[],
        role=call.role,
        exact_tokens=False,
        truncated="length" in call.finish_reasons,
        rollout_id=rollout.id,
        attempt_id=attempt_id,
        task_id=rollout.task.id,
        group_id=rollout.group_id,
        span_id=call.span.span_id,
        tool_call_ids=[str(c["id"]) for c in call.tool_calls if c.get("id")],
        text=TransitionText(
            messages=call.messages,
            response=call.response,
            tool_calls=call.tool_calls,
            tools=call.tools,
            model=call.model,
            response_id=call.response_id,
            input_tokens=call.input_tokens,
            output_tokens=call.output_tokens,
            source=call.source,
        ),
    )


def _signals(spans: Sequence[Span]) -> list[Signal]:
    out: list[Signal] = []
    for span in spans:
        order = span.start_ns
        attrs = span.attributes
        call_id = attrs.get(semconv.GEN_AI_TOOL_CALL_ID)
        role = attrs.get(semconv.ROLE)
        tool = attrs.get(semconv.GEN_AI_TOOL_NAME)
        if span.name == semconv.SPAN_SIGNAL and semconv.SIGNAL_NAME in attrs:
            value = float(attrs.get(semconv.SIGNAL_VALUE, 1.0))
            out.append(Signal(str(attrs[semconv.SIGNAL_NAME]), value, call_id, role, order, span.span_id, tool))
        elif span.name == semconv.SPAN_TOOL:
            failed = span.status.code == "error" or attrs.get(semconv.TOOL_STATUS) == "error"
            name = "tool_error" if failed else "tool_success"
            out.append(Signal(name, 1.0, call_id, role, order, span.span_id, tool))
    for captured in captured_tools(spans):
        name = "tool_error" if captured.failed else "tool_success"
        span = captured.span
        out.append(Signal(name, 1.0, captured.tool_call_id, captured.role, span.start_ns, span.span_id, captured.name))
    return [_mark_recovered(s, out) for s in out]


def _mark_recovered(signal: Signal, signals: Sequence[Signal]) -> Signal:
    """``signal`` marked ``recovered`` if it is a named tool's error that a later success of that tool by
    the same role followed."""
    if signal.name != "tool_error" or signal.tool is None:
        return signal
    later = any(
        s.name == "tool_success" and s.tool == signal.tool and s.role == signal.role and s.order > signal.order
        for s in signals
    )
    return replace(signal, recovered=True) if later else signal


def _by_tool_name(
    signal: Signal, transitions: Sequence[Transition], ended: Sequence[int], taken: set[str]
) -> int | None:
    """The latest call ended before ``signal`` that asked for its tool by name (each request used once)."""
    for i in range(len(transitions) - 1, -1, -1):
        text = transitions[i].text
        if ended[i] > signal.order or text is None:
            continue
        for call in text.tool_calls:
            cid = str(call.get("id") or f"{i}:{call.get('name')}")
            if call.get("name") == signal.tool and cid not in taken:
                taken.add(cid)
                return i
    return None


def _weight(policy: AIRPolicy, signal: Signal) -> float | Callable[[Signal], float] | None:
    """The policy's entry for ``signal``: per tool before general, a recovered error's own key first."""
    names = [f"{signal.name}_recovered", signal.name] if signal.recovered else [signal.name]
    for name in names:
        for key in ([f"{name}:{signal.tool}"] if signal.tool else []) + [name]:
            if key in policy:
                return policy[key]
    return None


def adapt_attempt(
    rollout: Rollout,
    attempt_id: str,
    spans: Sequence[Span],
    *,
    trainable: RoleSpec | RoleSelector = None,
    air: AIRPolicy | None = None,
) -> AdaptedAttempt:
    """Turn one attempt's spans into transitions (``reward`` = the AIR reward attached to each).

    ``spans`` must be the attempt's spans in store order; other attempts' spans are ignored.
    ``trainable=None`` follows the plugin's declarations (``lightning.trainable`` on its role spans):
    a declared role follows its flag; any other call is kept only if no role was declared trainable.
    Any other value decides alone.
    """
    selector = None if trainable is None else RoleSelector.of(trainable)
    own = sorted((s for s in spans if s.attempt_id == attempt_id), key=lambda s: s.seq)
    role_by_response: dict[str, str] = {}
    declared: dict[str, bool] = {}
    for span in own:
        if span.name == semconv.SPAN_LLM_CALL:
            continue
        rid = span.attributes.get(semconv.GEN_AI_RESPONSE_ID)
        role = span.attributes.get(semconv.ROLE)
        if rid and role:
            role_by_response[str(rid)] = str(role)
        flag = span.attributes.get(semconv.TRAINABLE)
        if role and isinstance(flag, bool):
            declared[str(role)] = flag

    calls = sorted((s for s in own if s.name == semconv.SPAN_LLM_CALL), key=lambda s: (s.start_ns, s.seq))
    # Calls captured by OpenLLMetry / OpenInference: those the gateway also served lend it their
    # role (joined on the response id); the others become text-level transitions.
    served = {str(s.attributes.get(semconv.GEN_AI_RESPONSE_ID)) for s in calls}
    text_only: list[CapturedCall] = []
    for call in captured_calls(own):
        if call.response_id is not None and call.response_id in served:
            if call.role is not None:
                role_by_response.setdefault(call.response_id, call.role)
        else:
            text_only.append(call)
    transitions: list[Transition] = []
    ended: list[int] = []
    result = AdaptedAttempt(transitions=[], signals=_signals(own))
    tool_signals = {t.span.span_id for t in captured_tools(own)}
    for step, span in enumerate(calls):
        attrs = span.attributes
        role = attrs.get(semconv.ROLE) or role_by_response.get(str(attrs.get(semconv.GEN_AI_RESPONSE_ID, "")))
        finish = attrs.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
        finish_list: list[Any] = finish if isinstance(finish, list) else [finish]  # pyright: ignore[reportUnknownVariableType]
        logprobs = attrs.get(semconv.RESPONSE_LOGPROBS)
        transitions.append(
            Transition(
                prompt_ids=_ints(attrs.get(semconv.PROMPT_TOKEN_IDS), "prompt token id", span),
                response_ids=_ints(attrs.get(semconv.RESPONSE_TOKEN_IDS), "response token id", span),
                response_logprobs=[float(x) for x in logprobs] if isinstance(logprobs, list) else None,  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
                model_version=attrs.get(semconv.MODEL_VERSION),
                adapter=attrs.get(semconv.ADAPTER),
                adapter_version=attrs.get(semconv.ADAPTER_VERSION),
                role=str(role) if role is not None else None,
                exact_tokens=bool(attrs.get(semconv.TOKENS_EXACT, True)),
                truncated="length" in finish_list,
                rollout_id=rollout.id,
                attempt_id=attempt_id,
                task_id=rollout.task.id,
                group_id=rollout.group_id,
                step_index=step,
                span_id=span.span_id,
                tool_call_ids=_tool_call_ids(span),
                text=_gateway_text(attrs),
            )
        )
        ended.append(span.end_ns or span.start_ns)
    if text_only:  # interleave the text-level calls by time: step order is call order
        starts = [s.start_ns for s in calls] + [c.start_ns for c in text_only]
        transitions += [_captured_transition(c, rollout, attempt_id) for c in text_only]
        ended += [c.end_ns for c in text_only]
        order = sorted(range(len(transitions)), key=lambda i: starts[i])
        transitions = [transitions[i] for i in order]
        ended = [ended[i] for i in order]
        for step, t in enumerate(transitions):
            t.step_index = step
    result.n_calls = len(transitions)

    # AIR: attach each signal to the call that requested its tool, then weigh it by the policy.
    by_call_id = {cid: i for i, t in enumerate(transitions) for cid in t.tool_call_ids}
    policy = air or {}
    taken: set[str] = set()
    for signal in result.signals:
        index = by_call_id.get(signal.tool_call_id) if signal.tool_call_id else None
        if index is None and signal.span_id in tool_signals and signal.tool:
            index = _by_tool_name(signal, transitions, ended, taken)
        if index is None:
            earlier = [
                i
                for i, t in enumerate(transitions)
                if ended[i] <= signal.order and (signal.role is None or t.role == signal.role)
            ]
            index = earlier[-1] if earlier else None
        if index is None:
            result.unattached_signals.append(signal)
            continue
        weight = _weight(policy, signal)
        if weight is None:
            continue
        reward = weight(signal) if callable(weight) else weight * signal.value
        transitions[index].reward += float(reward)

    if selector is None:
        # Declared roles follow their flag. The rest (no role, or never declared) train only when
        # no role was declared trainable: naming what trains excludes everything else (a crew's
        # planning calls), while only marking some role untrainable leaves the others trained.
        default = not any(declared.values())
        kept = [t for t in transitions if (declared[t.role] if t.role in declared else default)]
    else:
        kept = [t for t in transitions if selector(t.role)]
    result.n_untrainable = len(transitions) - len(kept)
    for i, t in enumerate(kept):
        t.step_index = i
    result.transitions = kept
    result.n_inexact = sum(not t.exact_tokens for t in kept)
    result.n_truncated = sum(t.truncated for t in kept)
    return result
