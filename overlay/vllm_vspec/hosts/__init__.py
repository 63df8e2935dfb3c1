"""Host adapters: thin subclasses of host (vLLM / vLLM-Ascend) classes.

Only this package imports vLLM. The core (config, controller, policies,
acceptance maths, stats) never does.
"""
