"""The surrogate objectives checked numerically against the formulas as TRL defines them.

A real (tiny) causal-LM policy, real sampled replies; the reference numbers are
computed here with one plain forward pass per (prompt, reply), independent of
the batched scoring the policy uses. With every estimator weight 1 the loss must
be TRL's: per-token loss l_it = -min(r_it A_i, clip(r_it) A_i) + beta k3_it,
averaged per `loss_type` ("grpo", "dapo", "dr_grpo").
"""

from __future__ import annotations

import pytest
import torch

from wmrl.core.loss import ObjectiveConfig, SurrogateBatch, k3, prior_term
from wmrl.core.types import Estimate, Group, Task, Trajectory
from wmrl.domains.autoresearch.policy import CodeAgentPolicy

PROMPTS = ["<|user|>\ntask 3: fit a model to column y0\n<|assistant|>\n", "<|user|>\ntask 8: fit y2\n<|assistant|>\n"]
ADV = [[0.9, -1.1, 0.4], [1.3, -0.2, -0.8]]
CLIP, BETA, L = 0.05, 0.3, 16


@pytest.fixture(scope="module")
def setup(tiny_lm):
    _, _, path = tiny_lm
    policy = CodeAgentPolicy(str(path), max_new_tokens=L, max_prompt_tokens=64)
    reference = CodeAgentPolicy(str(path), max_new_tokens=L, max_prompt_tokens=64)
    with torch.no_grad():  # a reference that differs from the policy, so the KL term is not zero
        for p in reference.module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    groups = []
    for g, prompt in enumerate(PROMPTS):
        replies, lps = policy.act([prompt] * 3, generator=torch.Generator().manual_seed(g))
        trajs = [Trajectory(task=Task(f"t{g}"), observations=[prompt], actions=[r], log_probs=[lp])
                 for r, lp in zip(replies, lps)]
        groups.append(Group(id=f"g{g}", task=Task(f"t{g}"), trajectories=trajs))
    est = Estimate(rewards=[[0.0] * 3] * 2, advantages=ADV, weights=[[1.0] * 3, [1.0] * 3])
    return policy, reference, groups, est


def _token_log_probs(policy, prompt, reply):
    """One sequence, one forward pass: log p(token t | prefix) for each reply token."""
    p, r = policy.prompt_ids(prompt), policy.reply_ids(reply)
    logits = policy.module(input_ids=torch.tensor([p + r])).logits[0].float()
    return torch.log_softmax(logits[len(p) - 1:-1], -1).gather(-1, torch.tensor(r)[:, None])[:, 0]


def _perturb(policy, seed):
    with torch.no_grad():
        for p in policy.module.parameters():
            p.add_(0.08 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + p.numel())))


def _trl(groups, old, new, ref, aggregation):
    losses, lengths = [], []
    for g, advs in zip(groups, ADV):
        for traj, a in zip(g.trajectories, advs):
            key = (traj.observations[0], traj.actions[0])
            r = torch.exp(new[key] - old[key])
            l_t = -torch.minimum(r * a, torch.clamp(r, 1 - CLIP, 1 + CLIP) * a) + BETA * k3(ref[key], new[key])
            losses.append(l_t)
            lengths.append(len(l_t))
    if aggregation == "grpo":
        return torch.stack([l_t.mean() for l_t in losses]).mean()
    if aggregation == "dapo":
        return torch.cat(losses).sum() / sum(lengths)
    return torch.cat(losses).sum() / (len(losses) * L)


@pytest.mark.parametrize("aggregation", ["grpo", "dapo", "dr_grpo"])
def test_token_level_losses_are_trls(setup, aggregation):
    policy, reference, groups, est = setup
    state = {k: v.clone() for k, v in policy.module.state_dict().items()}
    pairs = [(t.observations[0], t.actions[0]) for g in groups for t in g.trajectories]
    with torch.no_grad():
        old = {k: _token_log_probs(policy, *k) for k in pairs}
        ref = {k: _token_log_probs(reference, *k) for k in pairs}
    batch = SurrogateBatch(groups, est, ObjectiveConfig("token", aggregation, max_tokens=L, beta=BETA))
    batch.prepare(policy, reference, size=2)
    try:
        _perturb(policy, seed=5)  # the policy moved since the rollout: ratios differ from 1, some clip
        with torch.no_grad():
            new = {k: _token_log_probs(policy, *k) for k in pairs}
            ratios = torch.exp(torch.cat([new[k] - old[k] for k in pairs]))
            assert ((ratios < 1 - CLIP) | (ratios > 1 + CLIP)).any() and ((ratios - 1).abs() < CLIP).any()
            want = _trl(groups, old, new, ref, aggregation)
            got = batch.loss(policy, CLIP)
            shares = sum(share() for share in batch.micro_batches(policy, CLIP, 2))
        assert got.item() == pytest.approx(want.item(), abs=1e-5)
        assert shares.item() == pytest.approx(got.item(), abs=1e-5)
        assert batch.kl > 0
    finally:
        policy.module.load_state_dict(state)


def test_the_sequence_ratio_with_kl_is_the_per_trajectory_formula(setup):
    policy, reference, groups, est = setup
    state = {k: v.clone() for k, v in policy.module.state_dict().items()}
    batch = SurrogateBatch(groups, est, ObjectiveConfig(beta=BETA))
    batch.prepare(policy, reference)
    try:
        _perturb(policy, seed=9)
        with torch.no_grad():
            terms = []
            for g, advs in zip(groups, ADV):
                for traj, a in zip(g.trajectories, advs):
                    new = _token_log_probs(policy, traj.observations[0], traj.actions[0]).sum()
                    ref = _token_log_probs(reference, traj.observations[0], traj.actions[0]).sum()
                    r = torch.exp(new - traj.log_probs[0])  # against the behaviour log-prob the rollout kept
                    terms.append(-torch.minimum(r * a, torch.clamp(r, 1 - CLIP, 1 + CLIP) * a) + BETA * k3(ref, new))
            want = torch.stack(terms).mean()
            got = batch.loss(policy, CLIP)
        assert got.item() == pytest.approx(want.item(), rel=1e-5)
    finally:
        policy.module.load_state_dict(state)


def test_objective_settings_are_checked(setup):
    policy, _, groups, est = setup
    for bad, match in [(dict(ratio="sentence"), "ratio must be one of"),
                       (dict(aggregation="dapo"), "needs ratio: token"),
                       (dict(ratio="token", aggregation="dr_grpo"), "set trainer.objective.max_tokens"),
                       (dict(beta=-0.1), "beta must be a finite number >= 0"),
                       (dict(ptx=float("nan")), "ptx must be a finite number >= 0"),
                       (dict(ptx=1.0, ptx_examples=0), "ptx_examples must be an integer >= 1")]:
        with pytest.raises(ValueError, match=match):
            ObjectiveConfig(**bad).validate()
    with pytest.raises(RuntimeError, match="prepare"):
        SurrogateBatch(groups, est, ObjectiveConfig("token")).loss(policy, CLIP)


def test_a_run_with_a_kl_term_logs_it_and_a_token_ratio_needs_a_token_policy(tmp_path):
    from wmrl.api import build_trainer
    from wmrl.config import ConfigError, load_config
    from wmrl.core.metrics import read_jsonl

    small = ["trainer.steps=2", "trainer.groups_per_step=4", "trainer.eval_samples=1", "domain.real_delay_s=0",
             "tensorboard=false"]
    trainer = build_trainer(load_config("synthetic-program", [*small, f"run_dir={tmp_path / 'kl'}",
                                                              "trainer.objective.beta=0.1"]))
    try:
        trainer.train()
    finally:
        trainer.close()
    kl = [row["kl_ref"] for row in read_jsonl(tmp_path / "kl" / "metrics.jsonl")]
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[1] > 0  # the policy starts at the reference, then moves
    with pytest.raises(ConfigError, match="ratio=token needs per-token log-probabilities and ProgramPolicy has no "
                                          "token_log_probs: use ratio: sequence"):
        build_trainer(load_config("synthetic-program", [*small, f"run_dir={tmp_path / 'tok'}",
                                                        "trainer.objective.ratio=token"]))


@pytest.mark.parametrize("ratio, aggregation", [("sequence", "grpo"), ("token", "grpo"), ("token", "dapo"),
                                                ("token", "dr_grpo")])
def test_the_prior_term_is_aggregated_like_the_policy_term_and_a_step_on_it_raises_the_prior(tiny_lm, ratio,
                                                                                            aggregation):
    _, _, path = tiny_lm
    policy = CodeAgentPolicy(str(path), max_new_tokens=L, max_prompt_tokens=64)  # its own copy: a step changes it
    examples = [(PROMPTS[0], "import numpy as np\nprint(3)\n"), (PROMPTS[1], "print(8)\n")]
    per_token = [-_token_log_probs(policy, o, a) for o, a in examples]
    assert len(per_token[0]) != len(per_token[1])  # unequal lengths tell the aggregations apart
    expected = {"sequence": torch.stack([t.sum() for t in per_token]).mean(),  # what a sequence ratio sums
                "grpo": torch.stack([t.mean() for t in per_token]).mean(),
                "dapo": torch.cat(per_token).mean(),
                "dr_grpo": torch.cat(per_token).sum() / (2 * L)}["sequence" if ratio == "sequence" else aggregation]
    objective = ObjectiveConfig(ratio=ratio, aggregation=aggregation, max_tokens=L)
    term, logged = prior_term(policy, examples, objective)
    assert term.item() == pytest.approx(expected.item(), rel=1e-4)
    assert logged == pytest.approx(torch.cat(per_token).mean().item(), rel=1e-4)  # the log: mean token NLL
    policy.module.zero_grad()
    term.backward()
    torch.optim.SGD(policy.module.parameters(), lr=0.05).step()
    with torch.no_grad():
        assert prior_term(policy, examples, objective)[0].item() < term.item()


def test_a_run_with_a_prior_term_logs_its_nll_and_a_domain_without_prior_data_refuses_it(tmp_path, suite_agent):
    from wmrl.api import build_trainer
    from wmrl.config import ConfigError, load_config
    from wmrl.core.metrics import read_jsonl

    ptx = ["trainer.objective.ptx=1.0", "trainer.objective.ptx_examples=4", "tensorboard=false", "trainer.steps=2"]
    trainer = build_trainer(load_config("autoresearch", [
        *ptx, f"domain.agent={suite_agent}", "domain.sandbox_slots=2", "trainer.groups_per_step=2",
        "trainer.group_size=2", "trainer.eval_splits=[]", f"run_dir={tmp_path / 'ar'}"]))
    try:
        trainer.train()
    finally:
        trainer.close()
    nll = [row["prior_nll"] for row in read_jsonl(tmp_path / "ar" / "metrics.jsonl")]
    assert len(nll) == 2 and all(0.0 < v < 5.0 for v in nll)  # the agent was fine-tuned on this data
    with pytest.raises(ConfigError, match="ptx > 0 needs a domain with prior examples"):
        build_trainer(load_config("synthetic-program", [*ptx, f"run_dir={tmp_path / 'syn'}"]))


def test_k3_is_exact_up_to_its_linear_part_and_never_overflows():
    """A chunk of 56 action dimensions can move its log-ratio past 88, where exp overflows float32."""
    ref = torch.tensor([0.0, 5.0, 19.0, 100.0, 1000.0])
    new = torch.zeros(5, requires_grad=True)
    kl = k3(ref, new)
    d = ref[:3]
    assert torch.allclose(kl[:3], torch.exp(d) - d - 1)
    assert torch.isfinite(kl).all() and kl[3] < kl[4]
    kl.sum().backward()
    assert torch.isfinite(new.grad).all() and (new.grad[1:] < 0).all()  # pulls new back towards ref
