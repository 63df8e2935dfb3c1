"""Graph capture sizes for dynamic gamma: the launcher's `capture_policy`.

A captured graph replays one token count. With a static K a decode step of B
requests runs B * (1 + K) tokens; with dynamic gamma it runs B * (1 + gamma)
for whichever gamma the controller chose, and the drafter's later passes run
B tokens (width 1). A step whose token count has no graph is padded up to the
next captured size, or runs eagerly past the largest, so the sizes to capture
are every verify width times every batch size the policy keeps:

  exact   every batch size 1..max_num_seqs: no padding, the most graphs
  power2  1, 2, 4, ... and max_num_seqs: the controller's own batch-size
          buckets, so a bucket's steps pad to one graph per width
  steady  vLLM's default batch ladder (1, 2, 4, then every 8th) for every width
  auto    power2

Widths: 1 (target-only steps and the drafter's passes) and 1 + gamma for every
gamma the controller may choose (only 1 + K when vspec is off). Sizes above
the step's token budget are dropped: such a step cannot be scheduled.

Plain arithmetic, no vLLM import: the dry run shows the result.
"""

from __future__ import annotations

CAPTURE_POLICIES = ("auto", "exact", "power2", "steady")


def batch_sizes(policy: str, max_num_seqs: int) -> list[int]:
    """Batch sizes a policy captures for (each times every verify width)."""
    if policy == "auto":
        policy = "power2"
    if policy == "exact":
        return list(range(1, max_num_seqs + 1))
    if policy == "power2":
        sizes = [1 << i for i in range(max_num_seqs.bit_length()) if 1 << i <= max_num_seqs]
    elif policy == "steady":
        sizes = [b for b in (1, 2, 4) if b <= max_num_seqs] + list(range(8, max_num_seqs + 1, 8))
    else:
        raise ValueError(f"capture_policy={policy!r} is not allowed: one of {CAPTURE_POLICIES}")
    return sorted(set(sizes) | {max_num_seqs})


def verify_widths(min_gamma: int, max_gamma: int, dynamic: bool = True) -> list[int]:
    """Tokens a request runs in one step: 1 (drafter passes, gamma 0) and
    1 + gamma for each gamma in range (only max_gamma when not dynamic)."""
    gammas = range(min_gamma, max_gamma + 1) if dynamic else (max_gamma,)
    return sorted({1} | {1 + g for g in gammas})


def capture_sizes(policy: str, max_num_seqs: int, min_gamma: int, max_gamma: int,
                  dynamic: bool = True, max_num_batched_tokens: int | None = None) -> list[int]:
    """Sorted token counts to capture: every batch size times every width,
    within the token budget."""
    budget = max_num_batched_tokens or max_num_seqs * (1 + max_gamma)
    sizes = {b * w for b in batch_sizes(policy, max_num_seqs)
             for w in verify_widths(min_gamma, max_gamma, dynamic)}
    return sorted(s for s in sizes if s <= budget)
