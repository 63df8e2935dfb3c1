"""The draft model's captured graph parameters, keyed by (gamma, token count)
(not yet run on NPU).

vLLM-Ascend 0.23.0.post1 keeps what each captured attention call needs for
its replay update in one process-wide `GraphParams` per model kind
(compilation/acl_graph.py lines 292-297; the draft's `_draft_graph_params`,
line 325, created by `set_draft_graph_params` from model_runner_v1.py line 5099), with
four dicts keyed by token count only: at capture, `full_graph_fia` appends its
event, parameters and task handle to `attn_params[num_tokens]` (and
`events`, `handles`; attention/attention_v1.py lines 924, 955, 982), and
before a replay `update_graph_params` zips `attn_params[num_tokens]` with the
step's per-draft-step metadata, repeating the metadata keys to cover every
captured entry (lines 544-553 and 690-698). One captured graph per gamma at
the same token count would append to the same lists: replaying gamma g would
update every gamma's tasks with g's metadata cycled over them, so g's own
tasks get the wrong draft step's sequence lengths unless g's entries happen
to start at a multiple of g's period (tests/ascend/test_ascend_graphs.py shows it
with the host's own code).

`PerGammaGraphParams` is the host's own `GraphParams` dataclass whose four
dicts are `PerGamma` views: an int key reads and writes the store of the gamma
the proposer is drafting (`gamma_of()`: StepGammaProposer binds it around
every replay and update, and its graph wrapper's runnable binds it inside
every capture), so each gamma's capture appends to,
and its replay update reads, only its own lists. Outside a drafting pass
(gamma None: profiling and warm-up dummy runs, which draft K) it is K's store;
iteration there (the host's sleep-mode reset, device_allocator/
sleep_mem_optimized.py lines 86-95, which needs `dataclasses.fields` of a
GraphParams and `MutableMapping` values) yields `(gamma, num_tokens)` keys,
which index that gamma's store, so a reset clears every gamma's lists.

It is installed once, before the first draft capture (the host creates the
store just before capture, model_runner_v1.py lines 5094-5099), by replacing
the module global the host's getters read (`get_draft_graph_params`,
acl_graph.py lines 346-347; the capture's `weak_ref_workspaces` reads it at
line 219): never swapped per step.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Callable, Iterator


class PerGamma(MutableMapping):
    """{num_tokens: value} of the active key (the draft's gamma; the
    target's verify width, width_graphs.py); {(key, num_tokens): value}
    when iterated or indexed with a pair. `initials` gives each key's
    token counts and their empty values (a list starts empty, anything
    else is kept: the host's None workspaces)."""

    def __init__(self, gamma_of: Callable[[], int], initials: dict[int, dict]):
        self._gamma_of = gamma_of
        self.stores: dict[int, dict] = {
            g: {n: ([] if isinstance(v, list) else v) for n, v in initial.items()}
            for g, initial in initials.items()}

    def _split(self, key: Any) -> tuple[dict, Any]:
        if isinstance(key, tuple):
            gamma, key = key
            return self.stores[gamma], key
        return self.stores[self._gamma_of()], key

    def __getitem__(self, key: Any) -> Any:
        store, n = self._split(key)
        return store[n]

    def __setitem__(self, key: Any, value: Any) -> None:
        store, n = self._split(key)
        store[n] = value

    def __delitem__(self, key: Any) -> None:
        store, n = self._split(key)
        del store[n]

    def get(self, key: Any, default: Any = None) -> Any:
        store, n = self._split(key)
        return store.get(n, default)

    def __contains__(self, key: object) -> bool:
        store, n = self._split(key)
        return n in store

    def __iter__(self) -> Iterator[Any]:
        # Inside a drafting pass (the host's weak_ref_workspaces after a
        # capture, acl_graph.py lines 219 and 261-266): the active gamma's token counts.
        # Outside one: every (gamma, num_tokens) pair.
        if self._gamma_of.active() is not None:  # type: ignore[attr-defined]
            return iter(list(self.stores[self._gamma_of()]))
        return iter([(g, n) for g, store in self.stores.items() for n in store])

    def __len__(self) -> int:
        return sum(1 for _ in self)


class ActiveGamma:
    """The proposer's drafting gamma: `active()` while a pass runs (None
    outside), calling it gives the store to use (K outside a pass)."""

    def __init__(self, proposer: Any):
        self._proposer = proposer

    def active(self) -> int | None:
        return self._proposer._vspec_active_gamma

    def __call__(self) -> int:
        gamma = self.active()
        return self._proposer.max_num_speculative_tokens if gamma is None else gamma


def install(acl_graph: Any, proposer: Any, own_sizes: dict[int, Any] | None = None) -> Any:
    """Key the host's draft graph parameters by the proposer's gamma (once;
    a store already keyed, or none yet, is left as it is). Each gamma's
    store holds the host's token counts, or those of `own_sizes` (a gamma
    captured at its own verify width's sizes). Returns the store."""
    current = getattr(acl_graph, "_draft_graph_params", None)
    if current is None or isinstance(current.attn_params, PerGamma):
        return current
    gammas = range(1, proposer.max_num_speculative_tokens + 1)
    keyed = keyed_params(acl_graph, current, ActiveGamma(proposer),
                         {g: (own_sizes or {}).get(g) for g in gammas})
    acl_graph._draft_graph_params = keyed
    return keyed


FIELDS = ("events", "workspaces", "handles", "attn_params")


def keyed_params(acl_graph: Any, current: Any, key_of: Callable[[], int],
                 token_counts: dict[int, Any]) -> Any:
    """A host GraphParams whose four dicts are PerGamma views with one store
    per key of `token_counts`: each over that key's token counts (None: the
    host's store's), with the empty values the host's store holds."""
    def initials(field: str) -> dict[int, dict]:
        host = getattr(current, field)
        empty = next(iter(host.values()), [])
        return {key: dict(host) if counts is None else {n: host.get(n, empty) for n in counts}
                for key, counts in token_counts.items()}

    return acl_graph.GraphParams(*(PerGamma(key_of, initials(f)) for f in FIELDS))
