"""Model classes vllm_vspec adds to vLLM's ModelRegistry.

`register_models` is one entry of hosts/vllm_plugin.REGISTRATIONS. It
registers lazily (`"module:Class"` strings), so nothing here imports vLLM
model code until an engine actually asks for one of these architectures.
"""

from __future__ import annotations

# architecture name -> "module:Class". The EAGLE head answers to the
# checkpoint's name, to what vLLM's EAGLEConfig derives from it ("Eagle" +
# arch), and to the alias seen in the wild (also EAGLEConfig's name for a head
# whose config says plain "Qwen2ForCausalLM").
_QWEN2_EAGLE = f"{__name__}.qwen2_eagle:Qwen2ForCausalLMEagle"
MODELS: dict[str, str] = {
    "Qwen2ForCausalLMEagle": _QWEN2_EAGLE,
    "EagleQwen2ForCausalLMEagle": _QWEN2_EAGLE,
    "EagleQwen2ForCausalLM": _QWEN2_EAGLE,
}


def register_models() -> None:
    from vllm import ModelRegistry

    for arch, target in MODELS.items():
        ModelRegistry.register_model(arch, target)
