"""Exact replay: score gamma policies on recorded token streams and measured
step costs, with no run-to-run noise (`vllm-vspec replay`).

Two facts make it exact. With greedy decoding and strict acceptance the
target's output is the same under every policy, so a request's token stream
is recorded once. For a linear drafter, a step that verifies a gamma-g draft
proposed from the true prefix at decode position d accepts min(g, a_K(d)),
where a_K(d) is how many tokens of the drafter's K-token greedy chain from
that prefix match the stream: recorded once per position (record.py).

Layers: recording.py (the file and what follows from it, no vLLM),
record.py (the real engine writes it), costs.py (step costs measured on
in-process engines, fitted), score.py (the simulator's event loop driven by
the recording instead of synthetic acceptance: sim/simulator.py's
`simulate` with a `RecordedAcceptance`).
"""
