"""DPO from groups: the DPO / IPO loss against a hand computation, pair building from groups, and the
torch backend's preference update on the real tiny model (exact gradients, the margin moves up)."""

from __future__ import annotations

import asyncio
import math
import zlib
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_rl.algorithms.dpo import DPOConfig, PairSet, build_pairs
from lightning_rl.backends.losses import preference_loss
from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig, pack_micro_batches
from lightning_rl.credit import RolloutSample
from lightning_rl.engine.base import SamplingParams
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.types import Transition

# --- the loss ---------------------------------------------------------------------------------

POLICY_C = [-3.0, -5.0, -2.5]
POLICY_R = [-4.0, -2.5, -1.5]
REF_C = [-3.5, -5.5, -3.0]
REF_R = [-3.5, -4.0, -2.0]
WEIGHTS = [0.5, 0.25, 0.25]


def _tensors() -> list[torch.Tensor]:
    return [torch.tensor(v, dtype=torch.float64) for v in (POLICY_C, POLICY_R, REF_C, REF_R, WEIGHTS)]


def _h() -> list[float]:
    """h = (chosen - ref) - (rejected - ref) per pair."""
    return [(pc - rc) - (pr - rr) for pc, pr, rc, rr in zip(POLICY_C, POLICY_R, REF_C, REF_R, strict=True)]


def test_the_fixed_pairs_margins_by_hand() -> None:
    # (-3 + 3.5) - (-4 + 3.5) = 1; (-5 + 5.5) - (-2.5 + 4) = -1; (-2.5 + 3) - (-1.5 + 2) = 0
    assert _h() == pytest.approx([1.0, -1.0, 0.0])


def test_dpo_sigmoid_loss_equals_a_hand_computation() -> None:
    beta = 0.5
    pc, pr, rc, rr, w = _tensors()
    terms = preference_loss(pc, pr, rc, rr, w, beta=beta, loss="sigmoid")
    # -log sigmoid(x) = log(1 + exp(-x)); h = [1, -1, 0], so beta h = [0.5, -0.5, 0]
    expected = 0.5 * math.log1p(math.exp(-0.5)) + 0.25 * math.log1p(math.exp(0.5)) + 0.25 * math.log(2.0)
    assert float(terms.loss) == pytest.approx(expected, rel=1e-12)
    assert float(terms.margin) == pytest.approx(0.5 * 1.0 + 0.25 * -1.0 + 0.25 * 0.0)
    assert float(terms.accuracy) == pytest.approx(0.5)  # only pair 0: h = 0 is not "ranked right"
    assert float(terms.chosen) == pytest.approx(0.5)  # every chosen log-ratio is 0.5
    assert float(terms.rejected) == pytest.approx(0.5 * -0.5 + 0.25 * 1.5 + 0.25 * 0.5)


def test_ipo_loss_equals_a_hand_computation() -> None:
    beta = 0.25  # target margin 1 / (2 beta) = 2
    pc, pr, rc, rr, w = _tensors()
    terms = preference_loss(pc, pr, rc, rr, w, beta=beta, loss="ipo")
    expected = 0.5 * (1.0 - 2.0) ** 2 + 0.25 * (-1.0 - 2.0) ** 2 + 0.25 * (0.0 - 2.0) ** 2
    assert float(terms.loss) == pytest.approx(expected, rel=1e-12)


def test_dpo_gradient_pushes_chosen_up_and_rejected_down() -> None:
    pc, pr, rc, rr, w = _tensors()
    pc.requires_grad_(True)
    pr.requires_grad_(True)
    preference_loss(pc, pr, rc, rr, w, beta=0.5).loss.backward()  # pyright: ignore[reportUnknownMemberType]
    assert pc.grad is not None and pr.grad is not None
    # d/dpc of -log sigmoid(beta h) = -beta * sigmoid(-beta h) * w
    expected = [-0.5 * (1.0 / (1.0 + math.exp(0.5 * h))) * wi for h, wi in zip(_h(), WEIGHTS, strict=True)]
    assert pc.grad.tolist() == pytest.approx(expected)
    assert pr.grad.tolist() == pytest.approx([-g for g in expected])


def test_bad_preference_settings_are_rejected() -> None:
    pc, pr, rc, rr, w = _tensors()
    with pytest.raises(ValueError, match="beta"):
        preference_loss(pc, pr, rc, rr, w, beta=0.0)
    with pytest.raises(ValueError, match="sigmoid"):
        preference_loss(pc, pr, rc, rr, w, loss="hinge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="beta"):
        DPOConfig(beta=-1.0)
    with pytest.raises(ValueError, match="margin"):
        DPOConfig(margin=-0.1)
    with pytest.raises(ValueError, match="pairing"):
        DPOConfig(pairing="random")  # type: ignore[arg-type]


# --- pair building ----------------------------------------------------------------------------


def _t(rollout: str, prompt: list[int], response: list[int]) -> Transition:
    return Transition(prompt_ids=prompt, response_ids=response, rollout_id=rollout, attempt_id="a")


def _sample(rollout: str, group: str, reward: float, n_calls: int = 1) -> RolloutSample:
    # a response token per rollout name, the same in every process (``hash`` of a str is salted per
    # process: 1 run in 50 gave two rollouts the same response, and identical calls are never paired)
    token = zlib.crc32(rollout.encode()) % 10_000 + 100
    calls = [_t(rollout, [1, 2, k], [10 + k, token]) for k in range(n_calls)]
    return RolloutSample(rollout, group, reward, calls)


def _names(built: PairSet) -> list[tuple[str, str]]:
    return [(p.chosen[0].rollout_id, p.rejected[0].rollout_id) for p in built.pairs]


def test_ties_and_groups_of_one_make_no_pairs() -> None:
    samples = [
        _sample("a0", "g1", 1.0),
        _sample("a1", "g1", 1.0),
        _sample("a2", "g1", 1.0),
        _sample("b0", "g2", 0.3),
    ]
    for pairing in ("best_worst", "halves", "all"):
        built = build_pairs(samples, pairing=pairing)  # type: ignore[arg-type]
        assert built.pairs == [] and built.groups == 2 and built.groups_paired == 0


def test_halves_pairs_the_ith_best_with_the_ith_worst_and_ties_keep_rollout_order() -> None:
    samples = [_sample("r0", "g", 0.0), _sample("r1", "g", 1.0), _sample("r2", "g", 1.0), _sample("r3", "g", 0.0)]
    built = build_pairs(samples, pairing="halves")
    assert _names(built) == [("r1", "r3"), ("r2", "r0")]
    assert [p.reward_gap for p in built.pairs] == [1.0, 1.0]
    best_worst = build_pairs(samples, pairing="best_worst")
    assert _names(best_worst) == [("r1", "r3")]


def test_margin_keeps_only_pairs_with_a_larger_reward_gap() -> None:
    samples = [_sample("hi", "g", 1.0), _sample("mid", "g", 0.6), _sample("lo", "g", 0.0)]
    assert _names(build_pairs(samples, pairing="all")) == [("hi", "mid"), ("hi", "lo"), ("mid", "lo")]
    assert _names(build_pairs(samples, pairing="all", margin=0.5)) == [("hi", "lo"), ("mid", "lo")]
    assert _names(build_pairs(samples, pairing="all", margin=1.0)) == []  # strictly above the margin
    # halves pairs hi with lo only (mid is the odd one out)
    assert _names(build_pairs(samples, pairing="halves", margin=0.5)) == [("hi", "lo")]
    with pytest.raises(ValueError, match="margin"):
        build_pairs(samples, margin=-1.0)


def test_groups_are_never_mixed() -> None:
    samples = [_sample("a-hi", "a", 1.0), _sample("b-lo", "b", 0.0), _sample("a-lo", "a", 0.0)]
    built = build_pairs(samples, pairing="all")
    assert _names(built) == [("a-hi", "a-lo")]
    assert built.pairs[0].group_id == "a" and built.groups == 2 and built.groups_paired == 1


def test_call_unit_pairs_positions_both_rollouts_have_and_rollout_unit_pairs_whole_rollouts() -> None:
    long, short = _sample("long", "g", 1.0, n_calls=3), _sample("short", "g", 0.0, n_calls=2)
    per_call = build_pairs([long, short], unit="call")
    assert [(p.position, len(p.chosen), len(p.rejected)) for p in per_call.pairs] == [(0, 1, 1), (1, 1, 1)]
    assert per_call.pairs[1].chosen[0] is long.transitions[1] and per_call.pairs[1].rejected[0] is short.transitions[1]
    whole = build_pairs([long, short], unit="rollout")
    assert len(whole.pairs) == 1 and whole.pairs[0].position is None
    assert whole.pairs[0].chosen == long.transitions and whole.pairs[0].rejected == short.transitions


def test_identical_calls_and_tokenless_transitions_are_left_out() -> None:
    same = [_t("x", [1, 2], [5, 6])]
    hi = RolloutSample("hi", "g", 1.0, [same[0], _t("hi", [1, 2, 5, 6, 9], [7])])
    lo = RolloutSample(
        "lo", "g", 0.0, [same[0].model_copy(update={"rollout_id": "lo"}), _t("lo", [1, 2, 5, 6, 9], [8])]
    )
    built = build_pairs([hi, lo], unit="call")
    assert built.identical_calls == 1
    assert [(p.position, p.chosen[0].response_ids, p.rejected[0].response_ids) for p in built.pairs] == [(1, [7], [8])]
    empty = RolloutSample("e", "g", 0.0, [_t("e", [1], [])])
    assert build_pairs([hi, empty], unit="rollout").pairs == []


# --- the preference update on the tiny model ---------------------------------------------------


def _policy(path: Path, **cfg: object) -> TorchBackend:
    model = AutoModelForCausalLM.from_pretrained(path)
    return TorchBackend(model, TorchBackendConfig(**cfg))  # type: ignore[arg-type]


def _fixed_pairs() -> list[tuple[list[Transition], list[Transition]]]:
    gen = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(10, 500, (n,), generator=gen).tolist()

    out: list[tuple[list[Transition], list[Transition]]] = []
    for i in range(4):
        prompt = tokens(6 + i)
        chosen = [_t(f"c{i}", prompt, tokens(2 + i))]
        rejected = [_t(f"r{i}", prompt, tokens(3 + (i % 2)))]
        if i == 3:  # a whole-rollout pair: two calls on the chosen side
            chosen.append(_t(f"c{i}", prompt + chosen[0].response_ids + tokens(2), tokens(3)))
        out.append((chosen, rejected))
    return out


@pytest.mark.parametrize(("loss", "length_normalize"), [("sigmoid", False), ("ipo", True)])
def test_preference_gradient_is_the_losss_gradient_whatever_the_micro_batch(
    tiny_model_path: Path, loss: str, length_normalize: bool
) -> None:
    """The two-pass update (no-grad coefficients, then sum(coef * logp)) equals autograd through the loss."""
    pairs = _fixed_pairs()
    grads: list[list[torch.Tensor]] = []
    for budget in (10_000, 24):
        policy = _policy(tiny_model_path, micro_batch_tokens=budget, lr=0.0, max_grad_norm=0.0)
        policy.preference_update(pairs, beta=0.3, loss=loss, length_normalize=length_normalize)  # type: ignore[arg-type]
        grads.append([p.grad.clone() for p in policy.model.parameters() if p.grad is not None])
    # direct: sequence logprobs with gradient, the loss on them, one backward
    policy = _policy(tiny_model_path, lr=0.0, max_grad_norm=0.0)
    flat = [t for c, r in pairs for t in (*c, *r)]
    (mb,) = pack_micro_batches([(t.prompt_ids, t.response_ids) for t in flat], 10_000, 0)
    logp = policy._response_forward(policy.model, mb, entropy=False)[0]  # pyright: ignore[reportPrivateUsage]
    per_row = torch.split(logp, mb.response_lens)
    seq = {mb.indices[k]: per_row[k].sum() for k in range(len(flat))}
    with torch.no_grad():
        ref = [sum(x) for x in policy.logprobs(flat)]  # policy == reference before any step
    pos, sides_c, sides_r, refs_c, refs_r = 0, [], [], [], []
    for c, r in pairs:
        for side, out, refs in ((c, sides_c, refs_c), (r, sides_r, refs_r)):
            idx = list(range(pos, pos + len(side)))
            pos += len(side)
            n = sum(len(flat[i].response_ids) for i in idx) if length_normalize else 1
            out.append(sum((seq[i] for i in idx), torch.zeros(())) / n)
            refs.append(sum(ref[i] for i in idx) / n)
    w = torch.full((len(pairs),), 1.0 / len(pairs))
    direct = preference_loss(
        torch.stack(sides_c),
        torch.stack(sides_r),
        torch.tensor(refs_c),
        torch.tensor(refs_r),
        w,
        beta=0.3,
        loss=loss,  # type: ignore[arg-type]
    )
    policy.optimizer.zero_grad(set_to_none=True)
    direct.loss.backward()  # pyright: ignore[reportUnknownMemberType]
    grads.append([p.grad.clone() for p in policy.model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) == len(grads[2]) > 0
    for a, b, d in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(a, d, rtol=1e-4, atol=1e-6)


async def _sampled_groups(path: Path) -> list[RolloutSample]:
    """Two tasks x 4 rollouts sampled by the engine; reward: shorter answers are better (varies in a group)."""
    samples: list[RolloutSample] = []
    with TransformersEngine.from_pretrained(path, max_batch_size=8) as engine:
        for g, question in enumerate(("What is 2 + 3?", "Name a colour.")):
            prompt = engine.encode_chat([{"role": "user", "content": question}], None)
            results = await asyncio.gather(
                *(engine.generate(prompt, SamplingParams(max_tokens=10, temperature=1.0, seed=k)) for k in range(4))
            )
            for k, r in enumerate(results):
                t = Transition(
                    prompt_ids=prompt,
                    response_ids=r.token_ids,
                    response_logprobs=r.logprobs,
                    rollout_id=f"{g}-{k}",
                    attempt_id="a",
                )
                samples.append(RolloutSample(f"{g}-{k}", f"g{g}", -float(len(r.token_ids)) - 0.01 * k, [t]))
    return samples


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
async def test_two_preference_steps_move_the_chosen_minus_rejected_margin_up(tiny_model_path: Path, loss: str) -> None:
    built = build_pairs(await _sampled_groups(tiny_model_path), pairing="halves")
    assert len(built.pairs) == 4
    pairs = [(p.chosen, p.rejected) for p in built.pairs]
    # a small step: IPO's target margin is 1 / (2 beta) = 5 nats per pair, and a larger one overshoots it
    # in one step (IPO then pulls the margin back down, as it should)
    policy = _policy(tiny_model_path, lr=1e-4)

    def margin() -> float:
        chosen = policy.logprobs([t for side, _ in pairs for t in side])
        rejected = policy.logprobs([t for _, side in pairs for t in side])
        return sum(map(sum, chosen)) - sum(map(sum, rejected))

    start = margin()
    first = policy.preference_update(pairs, beta=0.1, loss=loss)  # type: ignore[arg-type]
    after_one = margin()
    second = policy.preference_update(pairs, beta=0.1, loss=loss)  # type: ignore[arg-type]
    after_two = margin()
    assert start < after_one < after_two, (start, after_one, after_two)
    # the first step finds the policy at the reference: zero log-ratios, loss log 2 (DPO) / (1/(2 beta))^2 (IPO)
    assert first["train/dpo_margin"] == pytest.approx(0.0, abs=1e-5)
    assert first["train/loss"] == pytest.approx(math.log(2.0) if loss == "sigmoid" else 25.0, rel=1e-4)
    assert first["train/kl_to_start"] == pytest.approx(0.0, abs=1e-6)
    assert second["train/dpo_margin"] > 0 and second["train/dpo_accuracy"] > 0.5
    assert second["train/kl_to_start"] > 0 and second["train/optimizer_steps"] == 1.0
    assert policy.step == 2


def test_preference_update_checks_its_input(tiny_model_path: Path) -> None:
    policy = _policy(tiny_model_path)
    with pytest.raises(ValueError, match="no pairs"):
        policy.preference_update([])
    with pytest.raises(ValueError, match="at least one chosen"):
        policy.preference_update([([], [_t("r", [1], [2])])])
    with pytest.raises(ValueError, match="prompt and response"):
        policy.preference_update([([_t("c", [1], [])], [_t("r", [1], [2])])])


# --- through the loop -------------------------------------------------------------------------


def test_two_dpo_steps_through_the_loop_train_on_pairs_of_each_group(tmp_path: Path, tiny_model_path: Path) -> None:
    """The registered ``dpo`` algorithm on the real loop: gateway, runner, adapter, pairs, update, publish."""
    from lightning_rl.algorithms import get_algorithm
    from lightning_rl.types import Task

    from .test_trainer_e2e import length_agent

    entry = get_algorithm("dpo")
    assert entry.config_class() is DPOConfig
    config = DPOConfig(
        model=str(tiny_model_path),
        run_dir=str(tmp_path / "run"),
        steps=2,
        batch_size=3,
        group_size=4,
        max_tokens=8,
        val_every=0,
        tensorboard=False,
        progress=False,
        rollout_timeout_s=30,
        backend=TorchBackendConfig(lr=1e-2, old_logprobs="sampled"),
        pairing="all",
    )
    tasks = [Task(input={"q": f"say something about {w}"}) for w in ("cats", "dogs", "rain", "tea")]
    result = entry.load()(config).fit(length_agent, tasks)
    train = [r for r in result.history if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    updated = [r for r in train if r["train/dpo_pairs"] > 0]
    assert updated, "length_agent's rewards vary within a group: some step must have pairs"
    for row in updated:
        assert row["train/optimizer_steps"] == 1.0 and math.isfinite(row["train/loss"])
        assert 0 < row["train/n_updated_transitions"] <= row["train/n_transitions"] == 12
        assert 0 < row["train/dpo_groups_paired_frac"] <= 1
    v0 = train[0]["model_version"] - 1
    assert [r["model_version"] for r in train] == [v0 + 1, v0 + 2]
    if train[0]["train/dpo_pairs"] > 0:  # the step after an update finds the policy moved off the start
        assert train[1]["train/dpo_pairs"] == 0 or train[1]["train/kl_to_start"] > 0


def test_the_dpo_rule_needs_its_config(tiny_model_path: Path) -> None:
    from lightning_rl.trainer import Trainer, TrainerConfig

    with pytest.raises(ValueError, match="DPOConfig"):
        Trainer(TrainerConfig(model=str(tiny_model_path), update_rule="dpo"))
