"""The policy-gradient surrogate the engine minimises, from an estimator's output.

PPO's clipped ratio objective over every graded trajectory, each weighted by
the estimator's weight (the denoiser's anchor weight, per-trajectory inverse
variance) and normalised by the total weight, so the weights fuse the streams
as a weighted mean instead of rescaling the step. Excluded trajectories (no
advantage) never enter. `trainer.objective` picks how ratios are taken and
averaged (`ObjectiveConfig`); with all weights 1 each choice is the formula of
the peers that use it:

* `ratio: sequence` (the default): one ratio per turn, exp of the sum of its
  token log-ratios, clipped once, against the behaviour log-probability the
  rollout recorded; every trajectory counts once, its turns equally.
* `ratio: token`: one ratio per token, clipped per token (TRL's and verl's
  GRPO). The old log-probabilities are recomputed without gradient before the
  update (as verl does), so they are the very numbers the new ones are compared
  to. Aggregations, with l_it the per-token loss of token t of trajectory i:
  `grpo`: mean over each trajectory's tokens, then over trajectories;
  `dapo`: sum over all tokens / number of tokens;
  `dr_grpo`: sum over all tokens / (trajectories x `max_tokens`).
  Needs a policy with `token_log_probs` (the causal-LM policies have it).
* `beta > 0` adds beta * KL(policy || reference) per unit (token or turn) with
  the k3 estimator exp(ref - new) - (ref - new) - 1 (TRL's, from Schulman's
  note), aggregated like the policy term; the reference is the policy as it
  was at step 0.
* `ptx > 0` adds ptx * the negative log-likelihood of `ptx_examples` fresh
  examples of the data the policy was fine-tuned on (`Domain.prior_examples`)
  to every update: InstructGPT's PPO-ptx. A KL to the step-0 policy only
  holds the policy where its own samples go (the training tasks); the prior
  data also covers what RL never visits. The NLL is aggregated like the
  policy term (`prior_term`), so `ptx` weighs the two on one scale: with a
  sequence ratio the policy term's gradient is a sum over a reply's tokens,
  and a per-token mean beside it would be as many times weaker (44 for the
  embedded AutoResearch agent's SFT replies).

Micro-batches (`micro_batches`) split the turns; every normaliser is computed
over the whole step first, so the shares add up to the whole loss exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable, Sequence

import torch

from wmrl.core.interfaces import Policy
from wmrl.core.ranks import block
from wmrl.core.types import Estimate, Group

__all__ = ["AGGREGATIONS", "RATIOS", "ObjectiveConfig", "SurrogateBatch", "k3", "has_token_log_probs",
           "prior_term"]

RATIOS = ("sequence", "token")
AGGREGATIONS = ("grpo", "dapo", "dr_grpo")


@dataclass
class ObjectiveConfig:
    #: "sequence": one clipped ratio per turn; "token": one per token (TRL, verl)
    ratio: str = "sequence"
    #: how token losses are averaged (ratio: token only): grpo | dapo | dr_grpo
    aggregation: str = "grpo"
    #: dr_grpo's constant length per trajectory (TRL: max_completion_length)
    max_tokens: int = 0
    #: weight of the KL to the step-0 policy (0: none)
    beta: float = 0.0
    #: weight of the NLL of the domain's prior (SFT) examples (InstructGPT's PPO-ptx; 0: none)
    ptx: float = 0.0
    #: prior examples per update (ptx > 0), fresh each step
    ptx_examples: int = 8

    def validate(self) -> None:
        if self.ratio not in RATIOS:
            raise ValueError(f"trainer.objective.ratio must be one of {', '.join(RATIOS)}, got {self.ratio!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"trainer.objective.aggregation must be one of {', '.join(AGGREGATIONS)}, "
                             f"got {self.aggregation!r}")
        if self.ratio == "sequence" and self.aggregation != "grpo":
            raise ValueError("trainer.objective.aggregation averages token losses: it needs ratio: token (with "
                             "ratio: sequence every trajectory counts once; leave aggregation at grpo)")
        if self.aggregation == "dr_grpo" and not (isinstance(self.max_tokens, int) and self.max_tokens >= 1):
            raise ValueError("trainer.objective.aggregation=dr_grpo divides by a constant length: set "
                             "trainer.objective.max_tokens (the policy's max_new_tokens, as TRL's max_completion_length)")
        for key in ("beta", "ptx"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"trainer.objective.{key} must be a finite number >= 0, got {value!r}")
        if not (isinstance(self.ptx_examples, int) and self.ptx_examples >= 1):
            raise ValueError(f"trainer.objective.ptx_examples must be an integer >= 1, got {self.ptx_examples!r}")


def prior_term(policy: Policy, examples: Sequence[tuple], objective: ObjectiveConfig) -> tuple[torch.Tensor, float]:
    """The negative log-likelihood of (observation, action) examples under `policy`, aggregated as `objective`
    aggregates the policy term, and the mean per-token NLL (a scale-free number to log).

    ratio sequence: the mean over examples of each one's summed token NLL (the sequence log-prob a ratio is
    taken on); ratio token: grpo the mean over examples of each one's mean token NLL, dapo the mean over all
    tokens, dr_grpo the sum over all tokens / (examples x `max_tokens`)."""
    lp, mask = policy.token_log_probs([o for o, _ in examples], [a for _, a in examples])
    mask = mask.to(lp.dtype)
    nll, tokens = -(lp * mask).sum(dim=1), mask.sum(dim=1)
    per_token = float((nll.sum() / tokens.sum().clamp(min=1.0)).detach())
    if objective.ratio == "sequence":
        return nll.mean(), per_token
    scale = token_scale(torch.ones(len(examples)), tokens.detach().float().cpu(), objective).to(nll.device)
    return (scale.to(nll.dtype) * nll).sum(), per_token


def token_scale(weights: torch.Tensor, tokens: torch.Tensor, objective: ObjectiveConfig) -> torch.Tensor:
    """Per trajectory, the factor each of its token losses gets when they are averaged as `objective.aggregation`
    says, given the trajectories' estimator weights and token counts: grpo the weighted mean over trajectories of
    each one's token mean; dapo the weighted token mean; dr_grpo the weighted sum over trajectories x
    `max_tokens`."""
    total = float(weights.sum()) or 1.0
    if objective.aggregation == "grpo":
        return weights / tokens.clamp(min=1) / total
    if objective.aggregation == "dapo":
        return weights / (float((weights * tokens).sum()) or 1.0)
    return weights / (total * objective.max_tokens)  # dr_grpo


def has_token_log_probs(policy: Policy) -> bool:
    """Whether `policy` implements `Policy.token_log_probs` (what ratio: token needs)."""
    return type(policy).token_log_probs is not Policy.token_log_probs


#: past this log-ratio k3 goes on as its tangent: a whole action chunk's log-ratio can pass 88, where exp
#: overflows float32, and the penalty must keep pulling back rather than turn the loss infinite
K3_LINEAR_FROM = 20.0


def k3(ref: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """The k3 estimate of KL(new || ref) from log-probabilities of samples of new: >= 0, unbiased (exact up
    to a log-ratio of `K3_LINEAR_FROM`, linear beyond)."""
    d = ref - new
    c = K3_LINEAR_FROM
    inside = d.clamp(max=c)
    exact = torch.exp(inside) - inside - 1
    return torch.where(d <= c, exact, exact + (math.exp(c) - 1) * (d - c))


class SurrogateBatch:
    """The flattened turns of one step's graded trajectories."""

    def __init__(self, groups: Sequence[Group], est: Estimate, objective: ObjectiveConfig | None = None):
        self.objective = objective or ObjectiveConfig()
        self.observations, self.actions, old, adv, turn_of = [], [], [], [], []
        traj_w: list[float] = []
        for g, advs, ws in zip(groups, est.advantages, est.weights):
            for traj, a, w in zip(g.trajectories, advs, ws):
                if a is None or w <= 0 or traj.turns == 0:
                    continue
                for t in range(traj.turns):
                    self.observations.append(traj.observations[t])
                    self.actions.append(traj.actions[t])
                    old.append(traj.log_probs[t])
                    adv.append(a)
                    turn_of.append(len(traj_w))
                traj_w.append(float(w))
        self.trajectories = len(traj_w)
        self._traj = torch.tensor(turn_of, dtype=torch.long)
        self._traj_w = torch.tensor(traj_w, dtype=torch.float32)
        total_w = float(self._traj_w.sum()) or 1.0
        turns = torch.bincount(self._traj, minlength=self.trajectories).float()
        self.old_log_probs = torch.tensor(old, dtype=torch.float32)
        self.advantages = torch.tensor(adv, dtype=torch.float32)
        #: per turn: its trajectory's weight over the trajectory's turns, normalised by the total weight
        self.weights = self._traj_w[self._traj] / turns[self._traj] / total_w
        self._prepared = self.objective.ratio == "sequence" and self.objective.beta == 0  # nothing to prepare
        self._ref: torch.Tensor | None = None  # per turn: the reference's log-prob (sequence, beta > 0)
        self._old_tokens: list[torch.Tensor] = []  # per turn: old per-token log-probs (token)
        self._ref_tokens: list[torch.Tensor] = []  # per turn: the reference's per-token log-probs (token, beta > 0)
        self._token_scale = torch.zeros(0)  # per turn: the weight each of its tokens gets (token)
        #: the weighted mean k3 estimate of KL(policy || reference) when the update starts (beta > 0)
        self.kl = float("nan")

    def __len__(self) -> int:
        return len(self.actions)

    @torch.no_grad()
    def prepare(self, policy: Policy, reference: Policy | None, size: int = 0) -> None:
        """The no-gradient pass before an update: old per-token log-probs (ratio: token) and the
        reference's log-probs (beta > 0), `size` turns at a time (0: all at once)."""
        obj, n = self.objective, len(self)
        if obj.beta > 0 and reference is None:
            raise ValueError("trainer.objective.beta > 0 needs the reference policy")
        chunks = [slice(i, min(i + (size or n), n)) for i in range(0, n, size or n)]
        if obj.ratio == "sequence":
            if obj.beta > 0 and n:
                self._ref = torch.cat([reference.log_prob(self.observations[c], self.actions[c]).float().cpu()
                                       for c in chunks])
                self.kl = float((self.weights * k3(self._ref, self.old_log_probs)).sum())
            self._prepared = True
            return
        for c in chunks:
            self._old_tokens += _rows(*policy.token_log_probs(self.observations[c], self.actions[c]))
            if obj.beta > 0:
                self._ref_tokens += _rows(*reference.token_log_probs(self.observations[c], self.actions[c]))
        counts = torch.tensor([len(o) for o in self._old_tokens], dtype=torch.float32)
        if obj.beta > 0 and [len(r) for r in self._ref_tokens] != counts.long().tolist():
            raise ValueError("the reference policy tokenizes the actions differently from the policy")
        tokens = torch.zeros(self.trajectories).index_add_(0, self._traj, counts)  # per trajectory
        self._token_scale = token_scale(self._traj_w, tokens, obj)[self._traj]
        if obj.beta > 0 and n:
            per_token = torch.repeat_interleave(self._token_scale, counts.long())
            kl = k3(torch.cat(self._ref_tokens), torch.cat(self._old_tokens))
            self.kl = float((per_token * kl).sum() / per_token.sum())
        self._prepared = True

    def loss(self, policy: Policy, clip_eps: float, rows: slice = slice(None)) -> torch.Tensor:
        """The surrogate over turns `rows` (all by default); the shares of a partition add up to the whole."""
        if not self._prepared:
            raise RuntimeError("SurrogateBatch.prepare(policy, reference) must run before the loss with "
                               f"ratio={self.objective.ratio!r} and beta={self.objective.beta}")
        if self.objective.ratio == "token":
            return self._token_loss(policy, clip_eps, rows)
        new = policy.log_prob(self.observations[rows], self.actions[rows])
        ratio = torch.exp(new - self.old_log_probs[rows])
        clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
        adv = self.advantages[rows]
        loss = -(self.weights[rows] * torch.minimum(ratio * adv, clipped * adv)).sum()
        if self.objective.beta > 0:
            loss = loss + self.objective.beta * (self.weights[rows] * k3(self._ref[rows], new)).sum()
        return loss

    def _token_loss(self, policy: Policy, clip_eps: float, rows: slice) -> torch.Tensor:
        idx = range(len(self))[rows]
        new = torch.cat(_rows(*policy.token_log_probs(self.observations[rows], self.actions[rows])))
        counts = torch.tensor([len(self._old_tokens[i]) for i in idx], dtype=torch.long)
        old = torch.cat([self._old_tokens[i] for i in idx]).to(new.device)
        if old.shape != new.shape:
            raise ValueError(f"the policy scored {new.numel()} tokens where the pass before the update scored "
                             f"{old.numel()}: its token_log_probs must tokenize an action the same way every time")
        scale = torch.repeat_interleave(self._token_scale[rows], counts).to(new.device)
        adv = torch.repeat_interleave(self.advantages[rows], counts).to(new.device)
        ratio = torch.exp(new - old)
        clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
        loss = -(scale * torch.minimum(ratio * adv, clipped * adv)).sum()
        if self.objective.beta > 0:
            ref = torch.cat([self._ref_tokens[i] for i in idx]).to(new.device)
            loss = loss + self.objective.beta * (scale * k3(ref, new)).sum()
        return loss

    def micro_batches(self, policy: Policy, clip_eps: float, size: int, *, rank: int = 0,
                      world: int = 1) -> list[Callable[[], torch.Tensor]]:
        """The loss as shares of at most `size` turns each (0: one share), computed only when called.

        One `log_prob` call per share bounds the memory of an update by `size`
        turns: the engine backpropagates a share before it computes the next.
        With `world` ranks, rank `rank` gets its contiguous block of the turns,
        each share scaled by `world` (the engine averages gradients over ranks),
        and every rank the same number of shares (a block that runs out gets the
        first turn's loss times 0), so the ranks' collectives pair up.
        """
        n = len(self)
        lo, hi = block(n, rank, world)
        longest = block(n, 0, world)[1]  # rank 0's block is a longest one
        size = size or max(longest, 1)
        count = max(1, -(-longest // size))
        shares: list[Callable[[], torch.Tensor]] = []
        for k in range(count):
            a, b = lo + k * size, min(lo + (k + 1) * size, hi)
            if a < b:
                share = partial(self.loss, policy, clip_eps, slice(a, b))
                shares.append(share if world == 1 else partial(_scaled, share, float(world)))
            else:  # through the same graph as a real share: ZeRO buckets gradients in the order hooks fire
                shares.append(partial(_scaled, partial(self.loss, policy, clip_eps, slice(0, 1)), 0.0))
        return shares


def _scaled(share: Callable[[], torch.Tensor], factor: float) -> torch.Tensor:
    return share() * factor


def _rows(lp: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Each row's token log-probs, in order, as 1-D float tensors (a policy may lay tokens out as it likes)."""
    return [lp[r][mask[r].bool()].float() for r in range(lp.shape[0])]
