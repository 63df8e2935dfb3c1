"""Tools around the product, never on an engine's hot path: the host ABI
check, the Ascend overlay builder, the drafter store, engine runs for the
demo and benchmarks, latency sampling, the install smoke check."""
