"""Per-request verify budgets: which draft slots a step verifies.

The batch-uniform controller (controller.py) gives every request the same
gamma. Here each request's drafted tokens carry the drafter's probability
of each token; a step verifies, per request, a PREFIX of its draft, chosen
so that the expected committed tokens per second of the step is highest:

- calibration.py: draft probability -> acceptance probability, learned
  online from the accept/reject feedback of verified slots, with its error
  (Brier score, expected calibration error).
- cost_model.py: step time as a function of the tokens the target verifies
  and the draft passes, per batch-size bucket, fitted online from the
  steps themselves (no start-up profiling).
- admission.py: survival scores and the top-budget admission (pure
  functions; the invariants are there).
- policy.py: VerifyBudgetPolicy, what a host calls once per step: it
  chooses the budget, the admitted prefix per request and the draft depth
  of the next step, and learns from the step's outcome.

Stdlib only (core layer). Not yet wired into an engine: the interface the
engine integration will call is docs/design/verify-budget.md.
"""
