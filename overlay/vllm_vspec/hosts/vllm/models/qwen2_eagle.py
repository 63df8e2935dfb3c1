"""Qwen2ForCausalLMEagle: an EAGLE-1 draft head for Qwen2 targets on vLLM 0.32.

vLLM 0.32 no longer ships this architecture; `register_models()` (this
package's __init__) adds it to vLLM's ModelRegistry under the names in MODELS.
Checkpoint layout (as Eagle-Qwen2.5-14B-Instruct ships it), tensor names
without a `model.` prefix:

    fc.weight [H, 2H], fc.bias [H]   input = concat(token embedding, target hidden)
    layers.0.self_attn.{q,k,v,o}_proj.weight   (q/k/v biases usually absent)
    layers.0.mlp.{gate,up,down}_proj.weight
    layers.0.post_attention_layernorm.weight
    embed_tokens.weight              optional: the target's when absent
    lm_head.weight                   optional: the target's when absent

Layer 0 has no input layernorm and the head has no final norm. Qwen2
attention has q/k/v biases, so any bias absent from the file (and fc.bias) is
zero: every bias is zeroed before loading, so loading the same file twice
gives identical weights. Absent embed_tokens / lm_head are replaced by the
target's in vLLM's EagleProposer.load_model (keyed on `has_own_embed_tokens`
/ `has_own_lm_head`), right after this model is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.models.interfaces import SupportsEagle
from vllm.model_executor.models.qwen2 import Qwen2DecoderLayer, Qwen2Model
from vllm.model_executor.models.utils import (
    AutoWeightsLoader,
    get_draft_quant_config,
    maybe_prefix,
)

class _EagleDecoderLayer(Qwen2DecoderLayer):
    """Qwen2 decoder layer without input layernorm: the fc output goes
    straight into attention (EAGLE-1's first layer)."""

    # extends Qwen2DecoderLayer.__init__: the input layernorm becomes identity.
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.input_layernorm = nn.Identity()


# Token dimension of each forward argument (positions is [T] or [3, T]).
@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": -1, "hidden_states": 0})
class _EagleQwen2Body(nn.Module):
    """embed -> fc([embed ; target hidden]) -> one decoder layer, no final norm."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "",
                 start_layer_id: int = 0) -> None:
        super().__init__()
        config = vllm_config.speculative_config.draft_model_config.hf_config
        if config.num_hidden_layers != 1:
            raise ValueError(
                f"EAGLE head config num_hidden_layers={config.num_hidden_layers} is not "
                "allowed: Qwen2ForCausalLMEagle (EAGLE-1) has exactly 1 decoder layer")
        quant_config = get_draft_quant_config(vllm_config)
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "embed_tokens"))
        # The layer is numbered after the target's layers so that the draft's
        # attention gets its own KV-cache slot in vLLM's forward context; its
        # weights are still `layers.0.*` (module index 0).
        self.layers = nn.ModuleList([
            _EagleDecoderLayer(config=config, cache_config=vllm_config.cache_config,
                               quant_config=quant_config,
                               prefix=maybe_prefix(prefix, f"layers.{start_layer_id}"))
        ])
        self.fc = ReplicatedLinear(2 * config.hidden_size, config.hidden_size, bias=True,
                                   quant_config=quant_config, return_bias=False,
                                   prefix=maybe_prefix(prefix, "fc"))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                hidden_states: torch.Tensor) -> torch.Tensor:
        x = self.fc(torch.cat((self.embed_tokens(input_ids), hidden_states), dim=-1))
        x, residual = self.layers[0](positions, x, None)
        return x + residual


class Qwen2ForCausalLMEagle(nn.Module, SupportsEagle):
    """vLLM model class for method "eagle" with a Qwen2 EAGLE-1 head."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.speculative_config.draft_model_config.hf_config
        self.config = config
        # Set by load_weights when the file carries its own copies.
        self.has_own_embed_tokens = False
        self.has_own_lm_head = False
        target_layers = vllm_config.model_config.get_num_layers(vllm_config.parallel_config)
        self.model = _EagleQwen2Body(vllm_config=vllm_config,
                                     prefix=maybe_prefix(prefix, "model"),
                                     start_layer_id=target_layers)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size,
                                      prefix=maybe_prefix(prefix, "lm_head"))
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                hidden_states: torch.Tensor, inputs_embeds: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if inputs_embeds is not None:
            raise NotImplementedError(
                "Qwen2ForCausalLMEagle drafts from token ids only (no multimodal inputs)")
        # EAGLE-1 has no final norm: the same state feeds the LM head and the
        # next draft step.
        h = self.model(input_ids, positions, hidden_states)
        return h, h

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load an EAGLE-1 checkpoint; returns every parameter name it set,
        so vLLM's strict loading check still catches misnamed tensors."""
        biases = {n for n, _ in self.named_parameters() if n.endswith(".bias")}
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name in biases:
                params[name].zero_()

        def renamed(items):
            for name, tensor in items:
                name = name.removeprefix("model.")
                if name.startswith("lm_head."):
                    self.has_own_lm_head = True
                else:
                    self.has_own_embed_tokens |= name.startswith("embed_tokens.")
                    name = "model." + name
                yield name, tensor

        loader = AutoWeightsLoader(self)
        loaded = loader.load_weights(renamed(weights), mapper=Qwen2Model.hf_to_vllm_mapper)
        # Zeroed biases are deterministic weights; absent embed_tokens /
        # lm_head are about to be shared from the target (module docstring).
        shared = {n for n in params if n.startswith(("model.embed_tokens.", "lm_head."))}
        return set(loaded) | biases | shared


__all__ = ["Qwen2ForCausalLMEagle"]
