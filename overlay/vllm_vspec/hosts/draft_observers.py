"""What a drafter step shows its observers, and the observers both hosts share.

vspec's proposers (hosts/vllm/proposers.py on vLLM 0.32,
vllm_ascend/vspec/proposers.py on vLLM-Ascend) take every greedy draft token
from one place: the draft head (kernels/draft_head.py: an active vocabulary
and/or int8 weights, else the drafter's own LM head) gives the logits, the
token is their argmax, and then each observer of the proposer's list sees
them. An observer has one job and never changes a draft token.

Order rule: every hook below goes to the observers in their list order,
each observer once per call (tests/unit/test_draft_observers.py). The proposers
list them as: what a tree step keeps of its first pass (EAGLE on vLLM 0.32,
tree/proposer.py), the draft probabilities (policy `budget`), the entropy
stop's record, then the diagnostics traces (hosts/diagnostics.py), last so
that the time they record covers the others' work as well.

Hooks, each a no-op unless an observer has a use for it:

- `loaded(model)`: once, the draft model is loaded (the IO trace hooks it);
- `committed(sampled, discard)`: a drafter step starts with the tokens the
  target committed (`sampled` [B, n] tensor, -1 padded, or one list per
  row; `discard` bool [B] or None: rows that commit nothing);
- `begin(kwargs)`: a propose call starts, with the host's keyword
  arguments;
- `sampled(hidden, logits, ids)`: one greedy draft distribution: logits
  [N, V'] over token ids `ids` (None: column j is token j), drawn from
  hidden [N, H] (one call per sequential draft position, N = B; one for
  parallel drafting, N = B * K);
- `end(drafts)`: the call returned its drafts [B, gamma] (None: it raised).

No vLLM import: the Ascend overlay's proposers use these too.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from vllm_vspec.kernels.entropy import EntropyStop


class DraftObserver:
    """An observer of a drafter's steps (module docstring); every hook is a
    no-op here."""

    # True when `sampled` needs the draft logits: with no head and no such
    # observer, the proposer keeps the host's own greedy path.
    reads_logits = False

    def loaded(self, model: torch.nn.Module) -> None:
        pass

    def committed(self, sampled: Any, discard: torch.Tensor | None) -> None:
        pass

    def begin(self, kwargs: Mapping[str, Any]) -> None:
        pass

    def sampled(self, hidden: torch.Tensor, logits: torch.Tensor,
                ids: torch.Tensor | None) -> None:
        pass

    def end(self, drafts: torch.Tensor | None) -> None:
        pass


def top_probability(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax [N], softmax probability of the argmax [N] float32) of logits [N, V]."""
    logits = logits.float()
    top, ids = logits.max(dim=-1)
    return ids, 1.0 / torch.exp(logits - top.unsqueeze(-1)).sum(dim=-1)


def per_draft(recorded: list[torch.Tensor], drafts: torch.Tensor) -> torch.Tensor | None:
    """What a step recorded per greedy call, in the drafts' [B, gamma] shape:
    one [B] per sequential draft position, or one [B * K] for parallel
    drafting, both stack and reshape to it; None when they do not fill it
    (a tree step: its first pass alone goes through the greedy path)."""
    if not recorded or drafts.shape[-1] == 0:
        return None
    stacked = torch.stack(recorded, dim=-1)
    return stacked.reshape(drafts.shape) if stacked.numel() == drafts.numel() else None


class StepRecord(DraftObserver):
    """Records one value per greedy draft distribution of a step (`record`)
    and, when the step ends, turns them into the step's result (`finish`),
    which `take()` hands over once."""

    reads_logits = True

    def __init__(self) -> None:
        self._step: list[torch.Tensor] = []
        self._result: torch.Tensor | None = None

    def record(self, logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def finish(self, recorded: list[torch.Tensor], drafts: torch.Tensor) -> torch.Tensor | None:
        raise NotImplementedError

    def begin(self, kwargs: Mapping[str, Any]) -> None:
        self._step, self._result = [], None

    def sampled(self, hidden: torch.Tensor, logits: torch.Tensor,
                ids: torch.Tensor | None) -> None:
        self._step.append(self.record(logits))

    def end(self, drafts: torch.Tensor | None) -> None:
        if drafts is not None:
            self._result = self.finish(self._step, drafts)
        self._step = []

    def take(self) -> torch.Tensor | None:
        """The last step's result, once (None when nothing was recorded
        since the last call)."""
        result, self._result = self._result, None
        return result


class DraftProbs(StepRecord):
    """The drafter's probability of each greedy draft token, for policy
    `budget`, at no extra pass: q = softmax(logits)[argmax] = 1 / sum_v
    exp(logits_v - max logits), over the logits the token came from (with an
    active vocabulary, over the active ids the head drafted from). The
    step's result: [B, gamma] probabilities."""

    def record(self, logits: torch.Tensor) -> torch.Tensor:
        return top_probability(logits)[1]

    def finish(self, recorded: list[torch.Tensor], drafts: torch.Tensor) -> torch.Tensor | None:
        return per_draft(recorded, drafts)


class EntropyRecord(StepRecord):
    """The entropy stop (kernels/entropy.py) on vLLM 0.32: the top-k entropy
    of every greedy draft distribution; the step's result: per-request draft
    lengths [B] (the runner cuts each request's draft to its length before
    the scheduler sees it, so a stop only ever shortens the gamma asked
    for). With an active vocabulary the entropy is over the active ids."""

    def __init__(self, stop: EntropyStop) -> None:
        super().__init__()
        self.stop = stop

    def record(self, logits: torch.Tensor) -> torch.Tensor:
        return self.stop.entropy(logits)

    def finish(self, recorded: list[torch.Tensor], drafts: torch.Tensor) -> torch.Tensor | None:
        if drafts.shape[-1] == 0:
            return None
        return self.stop.lengths(torch.stack(recorded, dim=-1).reshape(drafts.shape))


__all__ = ["DraftObserver", "StepRecord", "DraftProbs", "EntropyRecord", "per_draft",
           "top_probability"]
