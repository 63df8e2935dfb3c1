"""The EAGLE tree drafter in the runner's tree steps (docs/design/eagle-tree.md 4.4).

`EagleTreeDrafter` is a `tree/verify.TreeDrafter` (the runner's `tree` part's
`drafter`) over the engine's own EAGLE proposer's tree drafting (its
`tree`, tree/proposer.TreeDrafting): for a tree step it runs the runner's
linear drafting (`propose_linear`: vspec's gamma-0 handling, then the host,
which prepares the drafter's inputs from the verify forward: after a tree
step, the accepted path's rows, tree/verify.py) with the proposer's next
`propose` turned into `propose_tree`. The scheduler chooses the step's
(gamma, width) (VSpecScheduler, `vspec_tree_width`). Its own module: it
imports the proposers' tree drafting, which tree/verify.py does not need.
"""

from __future__ import annotations

from typing import Any

from vllm_vspec.kernels import tree
from vllm_vspec.hosts.vllm.tree.proposer import check_tree_drafting


class EagleTreeDrafter:
    """The engine's tree drafter when `tree_width` > 1: a tree of the
    scheduler's width for the step; at width 1 the runner's linear path
    (the host's EAGLE drafter) drafts, exactly as without trees."""

    def propose_tree(self, runner: Any, gamma: int, width: int, **propose_args: Any
                     ) -> tree.DraftTree | None:
        if width == 1:
            return None
        drafter = runner.drafter.tree
        drafter.propose_next_as_tree(width)
        try:
            runner.propose_linear(**propose_args)
        finally:
            drafted = drafter.take_tree()
        return drafted


def engine_tree_drafter(runner: Any, cfg: Any) -> EagleTreeDrafter | None:
    """The tree drafter vspec's runner starts with: one when `tree_width` >
    1, after checking that the engine's drafter can draft such trees
    (VSpecConfigError naming `tree_width` otherwise)."""
    if cfg is None or cfg.tree_width == 1:
        return None
    check_tree_drafting(runner.drafter, cfg.tree_width)
    return EagleTreeDrafter()
