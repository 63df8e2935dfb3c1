"""Draft probabilities carried with the draft token ids.

The `budget` policy ranks draft slots by the drafter's probability of the
token it drafted. vspec's proposers record it at no extra pass, from the
logits each greedy token came from (hosts/draft_observers.DraftProbs, the
proposer's `draft_probs` observer under policy `budget`). Here, the runner
side:

- `ScoredDraftTokenIds`: vLLM's DraftTokenIds with `draft_probs`
  (per request, one float per drafted token, in the same order): what the
  runner hands the scheduler. Stock code reads it as a DraftTokenIds.
- `ScoredDrafts` (the model runner's last `handover` part, model_runner.py):
  attaches the drafter's probabilities to the drafts `take_draft_token_ids`
  returns, cut to each request's draft length (the entropy cut runs before
  it; tree drafts are not scored: the budget policy refuses trees).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.outputs import DraftTokenIds


@dataclass
class ScoredDraftTokenIds(DraftTokenIds):
    """Drafts with the drafter's probability of each drafted token."""

    draft_probs: list[list[float]] = field(default_factory=list)


class ScoredDrafts:
    """Model runner part: the drafts handed to the scheduler carry the
    probabilities the drafter recorded (its `draft_probs` observer)."""

    def __init__(self, recorder) -> None:
        self.recorder = recorder

    def handover(self, out: DraftTokenIds | None) -> DraftTokenIds | None:
        """`out` with each drafted token's probability; the recorder's
        step is taken every call, so none outlives its step."""
        probs = self.recorder.take()
        if out is None or probs is None or type(out) is not DraftTokenIds:
            return out
        rows = probs.cpu().tolist()
        return ScoredDraftTokenIds(
            out.req_ids, out.draft_token_ids,
            [row[:len(d)] for row, d in zip(rows, out.draft_token_ids)])


__all__ = ["ScoredDraftTokenIds", "ScoredDrafts"]
