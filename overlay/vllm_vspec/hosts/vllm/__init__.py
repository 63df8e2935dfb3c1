"""Adapters for vLLM (0.32 on the CPU host; the Ascend overlay reuses the scheduler)."""
