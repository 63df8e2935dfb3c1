"""VSpecScheduler: vLLM's scheduler with a per-step gamma from GammaController.

Select it with `scheduler_cls=wiring.SCHEDULER_CLS` (`--scheduler-cls` on
`vllm serve`); vspec settings come from `additional_config={"vspec": {...}}`
and are read by `wiring.resolve`. One name serves both scheduling modes:
when the engine runs with async scheduling, `VSpecScheduler(...)` builds a
`VSpecAsyncScheduler`, which adds vLLM's AsyncScheduler to the same overrides.

How gamma reaches the model runner: vLLM (0.32) drafts
`SchedulerOutput.num_spec_tokens_to_schedule` tokens after each step, and the
scheduler verifies exactly the drafts it gets back the next step. So setting
that field once per step is the whole mechanism; gamma 0 means "draft
nothing", and the next step is a plain target-only step. With `tree_width` >
1 the step's tree width travels beside it as `vspec_tree_width` (an attribute
of the output; vspec's runner reads it), and the drafts come back as gamma*W
tree nodes with the width the runner drafted them with
(tree/verify.TreeDraftTokenIds; docs/design/eagle-tree.md).

Glossary (as in vLLM's rejection sampler): for one request in one step,
*drafted* = draft tokens verified, *accepted* = the prefix of them the target
agreed with, and the target adds one *recovered* (at the first rejection) or
*bonus* (all accepted) token, so committed = accepted + 1.
"""

from __future__ import annotations

import dataclasses
import time

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import RequestStatus

from vllm_vspec.hosts.vllm.budget_admission import BudgetAdmission
from vllm_vspec.hosts.vllm.prefix_tail import keep_prefix_tail
from vllm_vspec.hosts.vllm.tree.verify import request_allows_tree
from vllm_vspec.hosts.vllm.verify_width import VerifyWidth
from vllm_vspec.hosts.vllm.warm_key import warm_key
from vllm_vspec.core.controller import GammaController
from vllm_vspec.core.padded_gamma import HOLD, LOWER, padded_decision, padded_learner
from vllm_vspec.core.refill import RefillGate
from vllm_vspec.config import VSpecConfigError
from vllm_vspec.core.steps import BatchState, Decision, StepFeedback, drafted_depth
from vllm_vspec.hosts.wiring import resolve

# Under "vllm.": vLLM configures only its own logger tree, so INFO from any
# other name (e.g. plain __name__, "vllm_vspec....") would be dropped.
logger = init_logger(f"vllm.{__name__}")


class VSpecScheduler(Scheduler):
    """vLLM Scheduler whose draft length is decided every step."""

    # policy budget: per-request verify budgets (budget_admission.py); None otherwise.
    _budget: BudgetAdmission | None = None
    _stats_width = 1  # the tree width of the step update_from_output processes

    def __new__(cls, vllm_config, *args, **kwargs):
        # One user-facing name for both modes: under async scheduling the
        # engine must get an AsyncScheduler subclass (it fills placeholders).
        if cls is VSpecScheduler and vllm_config.scheduler_config.async_scheduling:
            cls = VSpecAsyncScheduler
        return super().__new__(cls)

    # extends Scheduler.__init__: build the controller from additional_config["vspec"];
    # first, an EAGLE head's prefix-cache hits keep their last block (prefix_tail.py).
    def __init__(self, vllm_config, kv_cache_config, *args, **kwargs) -> None:
        try:
            vspec_on = resolve(vllm_config) is not None
        except VSpecConfigError:
            # Refused settings: the host's own checks in its __init__ speak
            # first (as before vspec read anything), vspec's refusal after them.
            vspec_on = False
        if vspec_on and keep_prefix_tail(vllm_config, kv_cache_config):
            logger.info("vspec: prefix-cache hits keep their last block, as target-only's "
                        "(the host's disable_eagle_block_drop; the head's KV at a hit's last "
                        "position may be stale, which can change drafts only)")
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        # None: stock vLLM (no speculation, or vspec `enabled = false`).
        self.vspec_config = resolve(vllm_config)
        self.vspec: GammaController | None = None
        self._refill: RefillGate | None = None
        if self.vspec_config is None:
            return
        k = vllm_config.speculative_config.num_speculative_tokens
        mode = self.vspec_config.gamma0_mode
        self.vspec = GammaController(self.vspec_config, k,
                                     min_width=self.vspec_config.min_tree_width,
                                     max_width=self.vspec_config.tree_width,
                                     warm_key=warm_key(vllm_config))
        self._budget = BudgetAdmission.of(vllm_config, self.vspec_config, self.vspec)
        self._refill = (RefillGate(self.vspec_config.refill_batch,
                                   self.vspec_config.refill_max_wait_steps)
                        if self.vspec_config.refill_batch else None)
        # The host pads every decode to a uniform 1+K verify width unless it
        # has a per-batch-size K table (dynamic_sd_lookup). A per-step gamma
        # must not be padded back to K, so give the host the trivial table;
        # the value it yields is replaced each step in _update_after_schedule.
        self.dynamic_sd_lookup = [k] * (self.scheduler_config.max_num_seqs + 1)
        # id() of the SchedulerOutputs the controller decided and has not
        # yet observed (the steps it does not decide are not reported to it).
        self._decided: set[int] = set()
        # id() of the prefill steps the controller hears of (its policy
        # prices them or its trace records them: GammaController.hears_undecided)
        # and has not yet.
        self._prefill_steps: set[int] = set()
        # The same for padded steps (padded_gamma.py): they teach the policy too.
        self._padded_steps: set[int] = set()
        # Draft slots verified per step: gamma, or K padded with invalid
        # drafts to keep the target's full decode graph (vLLM-Ascend only).
        self._verify = VerifyWidth.of(vllm_config, self.vspec_config)
        # What the next step verifies of the last step's drafts, and the
        # tree width the runner drafted them with (1: linear drafts).
        self._verified = k
        self._width = 1
        # request -> gamma of the step that drafted its pending drafts (kept
        # only where steps can be padded).
        self._drafted: dict[str, int] = {}
        logger.info("vspec: policy=%s gamma in [%d, %d]%s, acceptance=%s%s",
                    self.vspec_config.policy, self.vspec_config.min_gamma,
                    self.vspec_config.max_gamma,
                    f" (gamma 0: {mode})" if self.vspec_config.min_gamma == 0 else "",
                    self.vspec_config.acceptance,
                    "" if self.vspec_config.lossless else " (LOSSY: outputs may "
                    "differ from target-only decoding)")
        if self._verify.pads_to_k:
            logger.info("vspec: decode steps of up to %d requests verify %d draft slots (the "
                        "step's gamma drafts, then invalid ones) so that the target keeps its "
                        "full decode graph; ascend_pad_verify_width=false verifies gamma",
                        self._verify.pad_max_reqs, k)

    # extends Scheduler.schedule: refill holding (refill.py) schedules a step
    # without its waiting queue; requests the host puts back into that queue
    # meanwhile (preemptions) go to the front of the real one, in order.
    def schedule(self, *args, **kwargs) -> SchedulerOutput:
        if self._budget is not None:
            # policy budget: cut each running request's drafts to its
            # admitted prefix before the host schedules them.
            self._budget.admit(self.running)
        waiting = self.waiting
        if self._refill is None or not self._refill.hold(
                (r.request_id for r in waiting),
                all(r.status == RequestStatus.WAITING and not r.num_preemptions for r in waiting),
                len(self.running), self.scheduler_config.max_num_seqs - len(self.running)):
            return super().schedule(*args, **kwargs)
        self.waiting = create_request_queue(self.policy)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            put_back, self.waiting = list(self.waiting), waiting
            for request in reversed(put_back):
                waiting.prepend_request(request)

    # extends Scheduler._update_after_schedule: apply the controller's
    # decision for this step before the host (AsyncScheduler) derives its
    # draft placeholders from it.
    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        if self.vspec is not None:
            if self._verify.pads:
                self._report_padding(scheduler_output)
            decision = self._decide(scheduler_output)
            if decision is not None:
                self._set_gamma(scheduler_output, decision.gamma, decision.width)
                if decision.decided:
                    self._decided.add(id(scheduler_output))
                elif decision.reason == "prefill" and self.vspec.hears_undecided:
                    self._prefill_steps.add(id(scheduler_output))
                elif decision.reason in (HOLD, LOWER) and self.vspec.prices_steps:
                    self._padded_steps.add(id(scheduler_output))
        super()._update_after_schedule(scheduler_output)

    def _decide(self, scheduler_output: SchedulerOutput) -> Decision | None:
        """The step's Decision: the controller's, except on a step whose
        drafts the next step verifies padded to 1 + K whatever their gamma
        (verify_width.py, VerifyWidth.pads_to_k): it
        drafts K unless the model policy's predictions show a smaller gamma
        gains (core/padded_gamma.py), and is not the controller's. There the
        target verifies 1 + K whatever the gamma, so a smaller one saves
        only draft passes and commits fewer tokens, and the step's time is
        no reward of the gamma it ran; its output still teaches the policy
        (update_from_output: padded_gamma.observe_padded)."""
        scheduled = scheduler_output.num_scheduled_tokens
        if self._verify.pads_to_k and 0 < len(scheduled) <= self._verify.pad_max_reqs:
            return padded_decision(self.vspec, lambda: self._batch_state(scheduled),
                                   len(scheduled), self._verify.k)
        return self.vspec.decide_step(scheduled, self.requests, _has_prefill(scheduler_output),
                                      lambda: self._batch_state(scheduled))

    def _batch_state(self, scheduled) -> BatchState:
        """The controller's view of a step's batch of `scheduled` requests."""
        requests = [self.requests[r] for r in scheduled]
        context = sum(r.num_computed_tokens for r in requests)
        return BatchState(
            num_reqs=len(scheduled),
            max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens,
            mean_context_len=context / len(scheduled),
            requests=tuple(scheduled),
            # What each may still generate: vLLM stops a request at its
            # max_tokens or at the model's length, whichever comes first.
            remaining=tuple(max(min(r.max_tokens - r.num_output_tokens,
                                    self.max_model_len - r.num_tokens), 0)
                            for r in requests),
            tree_allowed=self.vspec_config.tree_width > 1 and all(
                request_allows_tree(r.sampling_params, r.num_output_tokens) for r in requests))

    def _set_gamma(self, scheduler_output: SchedulerOutput, gamma: int, width: int = 1) -> None:
        """The runner drafts this many tokens after the step (on vLLM 0.23,
        which lacks the field, the Ascend overlay's runner reads the same
        attribute), as a tree of `width` (gamma * width nodes) when above 1."""
        scheduler_output.num_spec_tokens_to_schedule = gamma
        scheduler_output.vspec_tree_width = width
        # This step verifies the drafts the runner handed back after the
        # previous one, of the width it reported (update_draft_token_ids;
        # 1 until it hands some back).
        scheduler_output.vspec_verified_width, self._width = self._width, 1
        self._verified = self._verify.verified(gamma * width,
                                               len(scheduler_output.num_scheduled_tokens))
        if self._verify.pads:
            for req_id in scheduler_output.num_scheduled_tokens:
                self._drafted[req_id] = gamma

    def _report_padding(self, scheduler_output: SchedulerOutput) -> None:
        """Scheduled drafts beyond the gamma that drafted them are padding
        (verify_width.py): report them as vLLM's invalid spec tokens, which
        its acceptance metrics and _feedback do not count as drafts."""
        for req_id in scheduler_output.finished_req_ids:
            self._drafted.pop(req_id, None)
        for req_id, spec in scheduler_output.scheduled_spec_decode_tokens.items():
            pads = len(spec) - self._drafted.get(req_id, len(spec))
            if pads > 0:
                invalid = scheduler_output.num_invalid_spec_tokens or {}
                invalid[req_id] = max(invalid.get(req_id, 0), pads)
                scheduler_output.num_invalid_spec_tokens = invalid

    # extends Scheduler.update_draft_token_ids (sync scheduling): note the
    # tree width the runner drafted with (tree/verify.TreeDraftTokenIds;
    # plain DraftTokenIds are linear) and keep the drafts the next step
    # verifies (gamma * width of them). vLLM 0.23's runner hands back K
    # drafts a request whatever the step drafted, the NPU proposer's -1
    # after gamma (verify_width.py); elsewhere the lists already have at
    # most that length.
    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        if self._budget is not None:
            self._budget.drafted(draft_token_ids)   # their draft probabilities
        if self.vspec is not None:
            self._width = getattr(draft_token_ids, "width", 1)
            drafts = draft_token_ids.draft_token_ids
            if any(len(d) > self._verified for d in drafts):
                draft_token_ids = DraftTokenIds(draft_token_ids.req_ids,
                                                [d[:self._verified] for d in drafts])
        super().update_draft_token_ids(draft_token_ids)

    # extends Scheduler.update_from_output: report each step's verified drafts
    # and committed tokens to the controller, after the host has consumed them.
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput):
        # The width the step's verified drafts were drafted with, for
        # make_spec_decoding_stats (called inside).
        self._stats_width = getattr(scheduler_output, "vspec_verified_width", 1)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self.vspec is None:
            return outputs
        if self._budget is not None:   # before the controller observes the step
            self._budget.step_output(scheduler_output, model_runner_output,
                                     id(scheduler_output) in self._decided)
        if id(scheduler_output) in self._decided:
            self._decided.discard(id(scheduler_output))
            started = time.perf_counter()
            fb = _feedback(scheduler_output, model_runner_output)
            # The adapter's own share of the controller overhead: building fb.
            self.vspec.observe(fb, host_overhead_s=time.perf_counter() - started)
        elif (id(scheduler_output) in self._prefill_steps
              or id(scheduler_output) in self._padded_steps):
            # A prefill step's time, for the policy's cost model: what a
            # prompt costs, and what it costs the drafter while drafting. A
            # padded step's: its real drafts' acceptance, and its time with
            # every draft slot the target verified (the padding included).
            learn = None
            if id(scheduler_output) in self._padded_steps:
                learn = padded_learner(self.vspec, sum(
                    len(s) for s in scheduler_output.scheduled_spec_decode_tokens.values()))
            self._prefill_steps.discard(id(scheduler_output))
            self._padded_steps.discard(id(scheduler_output))
            scheduled = [r for r in scheduler_output.num_scheduled_tokens if r in self.requests]
            batch = (dataclasses.replace(self._batch_state(scheduled),
                                         prefill_tokens=_prefill_tokens(scheduler_output))
                     if scheduled else None)
            self.vspec.observe_undecided(batch, _feedback(scheduler_output, model_runner_output),
                                         learn)
        self.vspec.step_processed(busy=self.has_unfinished_requests())
        return outputs

    # extends Scheduler.make_spec_decoding_stats: a tree's verified drafts
    # count as its depth (drafted_depth, the rule _feedback applies), so vLLM's
    # spec-decode stats, and vspec:gamma read from them in the API-server
    # process (metrics.py), count draft positions as for a linear draft.
    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens: int,
                                 num_accepted_tokens: int,
                                 num_invalid_spec_tokens: dict[str, int] | None, request_id: str):
        valid = num_draft_tokens - (num_invalid_spec_tokens or {}).get(request_id, 0)
        if self._stats_width > 1 and valid > 0:
            num_draft_tokens, num_invalid_spec_tokens = drafted_depth(valid, self._stats_width), None
        return super().make_spec_decoding_stats(spec_decoding_stats, num_draft_tokens,
                                                num_accepted_tokens, num_invalid_spec_tokens,
                                                request_id)

    # extends Scheduler.shutdown: one summary line of what the controller did;
    # the controller saves its warm state (if it keeps one) and closes its trace.
    def shutdown(self) -> None:
        if self.vspec is not None:
            logger.info("vspec summary: %s", self.vspec.summary_line())
            if self._budget is not None:
                self._budget.close()
            self.vspec.close()
        super().shutdown()


class VSpecAsyncScheduler(VSpecScheduler, AsyncScheduler):
    """The same overrides over vLLM's AsyncScheduler (MRO: VSpecScheduler's
    methods run first and call into AsyncScheduler). Runs on GPU/NPU only:
    the CPU platform turns async scheduling off."""

    def _set_gamma(self, scheduler_output: SchedulerOutput, gamma: int, width: int = 1) -> None:
        super()._set_gamma(scheduler_output, gamma, width)
        # AsyncScheduler._update_after_schedule (next in the MRO) gives each
        # request these as next-step draft placeholders; vLLM 0.23 sizes
        # them once by K, so size them by the slots the next step verifies:
        # this step's gamma (0.32 does too), or K when padding keeps the
        # target's full decode graph (verify_width.py).
        self._spec_token_placeholders = [-1] * self._verified


def _has_prefill(so: SchedulerOutput) -> bool:
    """True when some request in the step processes more than its one new
    token plus its drafts (a new, resumed or chunked prompt)."""
    return _prefill_tokens(so) > 0


def _prefill_tokens(so: SchedulerOutput) -> int:
    """The prompt tokens a step processes: what it schedules beyond each
    request's one new token and its drafts."""
    # Every request schedules at least its new token and its drafts
    # (vLLM's Scheduler.schedule keeps only the drafts within the tokens it
    # scheduled), so the totals match exactly when no request does more.
    # Rule: this runs every step, so it costs O(requests with drafts), never
    # a loop over the whole batch.
    spec = so.scheduled_spec_decode_tokens
    return so.total_num_scheduled_tokens - len(so.num_scheduled_tokens) - sum(
        len(s) for s in spec.values())


def _feedback(so: SchedulerOutput, out: ModelRunnerOutput) -> StepFeedback:
    """Per-request drafted/accepted counts of one step, read from the host's
    own outputs (the same numbers vLLM's spec-decode metrics count)."""
    sampled = out.sampled_token_ids or []
    index = out.req_id_to_index
    invalid = so.num_invalid_spec_tokens or {}
    width = getattr(so, "vspec_verified_width", 1)
    drafted: list[int] = []
    accepted: list[int] = []
    requests: list[str] = []
    committed = 0
    for req_id in so.num_scheduled_tokens:
        i = index.get(req_id)
        n_out = len(sampled[i]) if i is not None and i < len(sampled) else 0
        committed += n_out
        spec = so.scheduled_spec_decode_tokens.get(req_id)
        if spec and n_out:
            # As vLLM's spec-decode metrics count them: drafts rejected by a
            # grammar (padded with -1) were never verified. A tree of width W
            # counts its depth (the controller's per-position acceptance is
            # per depth): W list entries a depth, the last one possibly cut
            # by the host's token budget.
            drafted.append(drafted_depth(len(spec) - invalid.get(req_id, 0), width))
            accepted.append(n_out - 1)
            requests.append(req_id)
    return StepFeedback(drafted=tuple(drafted), accepted=tuple(accepted), committed=committed,
                        width=width, requests=tuple(requests))
