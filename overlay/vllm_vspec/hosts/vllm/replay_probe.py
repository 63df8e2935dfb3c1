"""The probe engine's scheduler for `replay record`: vLLM's own, keeping
the draft probabilities of each request's first draft.

A probe request's prefill step drafts K tokens from the true prefix
(replay/record.py), and the drafts reach the scheduler with the drafter's
probability of each drafted token where vspec's proposer records them
(hosts/vllm/proposers.py under policy `budget`: ScoredDraftTokenIds from
the model runner's handover). The scheduler itself stays vLLM's: every
step drafts and verifies K, and an EAGLE engine's prefix-cache hits drop
their last block as stock vLLM does, so the drafts are the stock engine's.

Select with `scheduler_cls=PROBE_SCHEDULER_CLS`; the recorder reads
`take_first_draft_probs` from the in-process engine's scheduler.
"""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds

PROBE_SCHEDULER_CLS = "vllm_vspec.hosts.vllm.replay_probe.ProbeScheduler"


class ProbeScheduler(Scheduler):
    """vLLM's Scheduler that remembers the draft probabilities of each
    request's first draft (its prefill step's), until taken."""

    # extends Scheduler.__init__: an empty record of first drafts.
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.first_draft_probs: dict[str, list[float]] = {}

    # extends Scheduler.update_draft_token_ids: a request's first scored
    # draft keeps its probabilities before vLLM stores the drafts; later
    # drafts of the same request do not replace them.
    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        probs = getattr(draft_token_ids, "draft_probs", None)
        if probs:
            for req_id, row in zip(draft_token_ids.req_ids, probs):
                if req_id in self.requests:
                    self.first_draft_probs.setdefault(req_id, [float(p) for p in row])
        super().update_draft_token_ids(draft_token_ids)

    def take_first_draft_probs(self, req_id: str) -> list[float] | None:
        """The probabilities of `req_id`'s first draft, once (None: its
        drafts came without them)."""
        return self.first_draft_probs.pop(req_id, None)


__all__ = ["PROBE_SCHEDULER_CLS", "ProbeScheduler"]
