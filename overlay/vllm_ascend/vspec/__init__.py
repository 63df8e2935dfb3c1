"""vSpec Adaptive on vLLM-Ascend: native subclasses dropped into the
vllm_ascend tree by build_overlay.py (not yet run on NPU).

`routing` is the only module the patched host files import; it decides, from
`additional_config["vspec"]`, which of our classes replace the host's:
`proposers` (per-step gamma drafting), `sampler` (acceptance rules on the NPU
path) and the vspec scheduler from `vllm_vspec.hosts`.
"""
