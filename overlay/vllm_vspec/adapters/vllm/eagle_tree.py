"""The EAGLE tree drafter in the runner's tree steps (docs/eagle-tree.md 4.4).

`EagleTreeDrafter` is a `tree_verify.TreeDrafter` (the runner's
`tree_drafter`) over the engine's own EAGLE proposer (TreeDraftMixin): for a
tree step it runs the rest of the runner's `propose_draft_token_ids` chain
(vspec's runner mixins, then the host, which prepares the drafter's inputs
from the verify forward: after a tree step, the accepted path's rows,
tree_verify.py) with the proposer's next `propose` turned into
`propose_tree`. Its own module: tree_verify imports the proposers.
"""

from __future__ import annotations

from typing import Any

from vllm_vspec import tree
from vllm_vspec.adapters.vllm.tree_proposer import check_tree_drafting
from vllm_vspec.adapters.vllm.tree_verify import TreeVerifyMixin


class EagleTreeDrafter:
    """Trees of the widest width <= `width` the engine's K allows at the
    step's gamma (gamma * W <= num_speculative_tokens), so a fixed maximum
    width works with any gamma the scheduler picks (until the scheduler
    chooses (gamma, width) arms, docs/eagle-tree.md step 5)."""

    def __init__(self, width: int) -> None:
        if width < 1:
            raise ValueError(f"width={width} is not allowed: an integer >= 1")
        self.width = width

    def propose_tree(self, runner: Any, gamma: int, **propose_args: Any
                     ) -> tree.DraftTree | None:
        drafter = runner.drafter
        width = min(self.width, runner.speculative_config.num_speculative_tokens // gamma)
        check_tree_drafting(drafter, width)
        drafter.propose_next_as_tree(width)
        try:
            super(TreeVerifyMixin, runner).propose_draft_token_ids(**propose_args)
        finally:
            drafted = drafter.take_tree()
        return drafted
