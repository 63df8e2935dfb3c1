"""Per-request verify budgets: which draft slots a step verifies.

The batch-uniform controller (controller.py) gives every request the same
gamma. Here each request's drafted tokens carry the drafter's probability
of each token; a step verifies, per request, a PREFIX of its draft, chosen
so that the expected committed tokens per second of the step is highest:

- calibration.py: draft probability -> acceptance probability, learned
  online from the accept/reject feedback of verified slots, with its error
  (Brier score, expected calibration error).
- step time: the `model` policy's pooled step-cost model
  (core/step_cost.py PooledStepCost), one linear fit over every observed
  step whatever its batch size (no start-up profiling).
- admission.py: survival scores and the top-budget admission (pure
  functions; the invariants are there).
- policy.py: VerifyBudgetPolicy, what a host calls once per step: it
  chooses the budget, the admitted prefix per request and the draft depth
  of the next step, and learns from the step's outcome.

Core layer (no host import; numpy through core/step_cost.py). The
interface the engine integration calls is docs/design/verify-budget.md.
"""
