"""The executor vspec selects on vLLM-CPU (wiring.EXECUTOR_CLS).

With a speculative config and synchronous scheduling, vLLM's engine core
asks the executor for the step's drafts after every step that ran the model
(EngineCore.post_step). On vLLM-CPU the worker lives in a process of its
own (CpuPlatform.check_and_update_config turns the `uni` executor into `mp`
whenever the engine core has its own process), so that question is a round
trip through the executor's shared-memory queues: the engine core waits
while the worker wakes, answers and the engine core wakes again. A
target-only engine makes no such call. A step vspec scheduled at gamma 0
drafts nothing, so the answer is known to be None before asking: such a
step makes no round trip, and a vspec engine at gamma 0 pays per step what
a target-only engine pays (docs/log/benchmarks.md has the measurement).

Steps at gamma >= 1 ask as stock vLLM does; an engine whose scheduler is not
vspec's (no `num_spec_tokens_to_schedule` on its scheduler output) asks on
every step, as stock vLLM does.
"""

from __future__ import annotations

from vllm.v1.executor.multiproc_executor import MultiprocExecutor


class VSpecMultiprocExecutor(MultiprocExecutor):
    """vLLM's multiprocess executor, minus the draft round trip of steps
    that draft nothing."""

    _step_drafts = True

    # extends MultiprocExecutor.execute_model: note whether the runner
    # drafts after this step (vspec's scheduler sets the step's gamma on
    # the scheduler output, scheduler.VSpecScheduler._set_gamma).
    def execute_model(self, scheduler_output, non_block: bool = False):
        self._step_drafts = getattr(scheduler_output, "num_spec_tokens_to_schedule", None) != 0
        return super().execute_model(scheduler_output, non_block)

    # extends MultiprocExecutor.take_draft_token_ids: after a gamma-0 step the
    # runner holds no drafts (its take_draft_token_ids would answer None).
    def take_draft_token_ids(self):
        if not self._step_drafts:
            return None
        return super().take_draft_token_ids()
