"""Transformer model shapes: a named registry of dense and MoE flavours.

Parameter counts follow the standard decoder block: attention projections
``h*(q_dim + 2*kv_dim) + q_dim*h``, a SwiGLU MLP ``3*h*F`` (GeLU: ``2*h*F``), MoE layers
with ``num_experts`` routed experts of width ``expert_ffn`` plus an optional shared expert,
and an input embedding plus an output projection of ``vocab*h`` each (one if tied).
"""

from __future__ import annotations

from dataclasses import dataclass

from infrarsi.core.errors import SpecError


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    name: str
    num_layers: int
    hidden: int
    ffn_hidden: int              # dense MLP width (0 for a pure-MoE block)
    num_heads: int
    num_kv_heads: int
    vocab: int
    head_dim: int | None = None  # defaults to hidden // num_heads
    swiglu: bool = True
    tied_embeddings: bool = False
    num_experts: int = 0         # 0: dense
    experts_per_token: int = 0
    expert_ffn: int = 0
    shared_expert_ffn: int = 0

    def __post_init__(self) -> None:
        if self.num_experts and not (0 < self.experts_per_token <= self.num_experts and self.expert_ffn > 0):
            raise SpecError(f"model {self.name!r}: an MoE needs 0 < experts_per_token <= num_experts and expert_ffn > 0")
        if self.num_heads % self.num_kv_heads:
            raise SpecError(f"model {self.name!r}: num_heads ({self.num_heads}) must be a multiple of num_kv_heads")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_dim(self) -> int:
        return self.num_heads * (self.head_dim or self.hidden // self.num_heads)

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * (self.head_dim or self.hidden // self.num_heads)

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.swiglu else 2

    @property
    def attention_params(self) -> int:
        return self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden

    @property
    def dense_mlp_params(self) -> int:
        """Per layer: the dense MLP, or the shared expert and router of an MoE layer."""
        if self.is_moe:
            return self.mlp_matrices * self.hidden * self.shared_expert_ffn + self.hidden * self.num_experts
        return self.mlp_matrices * self.hidden * self.ffn_hidden

    @property
    def expert_params(self) -> int:
        """Per layer, all routed experts together."""
        return self.num_experts * self.mlp_matrices * self.hidden * self.expert_ffn

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def num_params(self) -> int:
        per_layer = self.attention_params + self.dense_mlp_params + self.expert_params
        return self.num_layers * per_layer + self.embedding_params

    @property
    def num_active_params(self) -> int:
        """Parameters one token touches (top-k experts only), embedding lookup included."""
        experts = self.experts_per_token * self.mlp_matrices * self.hidden * self.expert_ffn
        per_layer = self.attention_params + self.dense_mlp_params + experts
        return self.num_layers * per_layer + self.embedding_params

    def flops_per_token(self, seq_len: int, *, causal: bool = True) -> float:
        """Model FLOPs per trained token for MFU: ``6 * N_active`` (without the input-embedding
        lookup) plus attention scores and values, ``12 * L * d_q * s`` counted in full
        (PaLM App. B, torchtitan) or ``6 * L * d_q * s`` with ``causal`` (only the unmasked
        half is work: the convention of Megatron-LM's causal count and FlashAttention's
        FLOP/s figures). The simulator reports causal MFU; calibration compares each
        publication in its own convention."""
        n = self.num_active_params - self.vocab * self.hidden * (0 if self.tied_embeddings else 1)
        return 6.0 * n + (6.0 if causal else 12.0) * self.num_layers * self.q_dim * seq_len


_MODELS = {
    m.name: m
    for m in [
        # Calibration shapes from the model cards.
        ModelShape(name="llama3-8b", num_layers=32, hidden=4096, ffn_hidden=14336, num_heads=32,
                   num_kv_heads=8, vocab=128256),
        ModelShape(name="llama3-70b", num_layers=80, hidden=8192, ffn_hidden=28672, num_heads=64,
                   num_kv_heads=8, vocab=128256),
        ModelShape(name="mpt-7b", num_layers=32, hidden=4096, ffn_hidden=16384, num_heads=32,
                   num_kv_heads=32, vocab=50432, swiglu=False, tied_embeddings=True),
        ModelShape(name="mixtral-8x22b", num_layers=56, hidden=6144, ffn_hidden=0, num_heads=48,
                   num_kv_heads=8, vocab=32768, num_experts=8, experts_per_token=2, expert_ffn=16384),
        # Shapes for the generated benchmark jobs (``generator.py``), from each model's
        # published config.json on the Hugging Face Hub (meta-llama/Llama-2-7b-hf,
        # meta-llama/Llama-2-13b-hf, mistralai/Mistral-7B-v0.1, Qwen/Qwen2.5-14B,
        # Qwen/Qwen2.5-32B, mistralai/Mixtral-8x7B-v0.1, allenai/OLMoE-1B-7B-0924,
        # Qwen/Qwen1.5-MoE-A2.7B, deepseek-ai/deepseek-moe-16b-base).
        ModelShape(name="llama2-7b", num_layers=32, hidden=4096, ffn_hidden=11008, num_heads=32,
                   num_kv_heads=32, vocab=32000),
        ModelShape(name="llama2-13b", num_layers=40, hidden=5120, ffn_hidden=13824, num_heads=40,
                   num_kv_heads=40, vocab=32000),
        ModelShape(name="mistral-7b", num_layers=32, hidden=4096, ffn_hidden=14336, num_heads=32,
                   num_kv_heads=8, vocab=32000),
        ModelShape(name="qwen2.5-14b", num_layers=48, hidden=5120, ffn_hidden=13824, num_heads=40,
                   num_kv_heads=8, vocab=152064),
        ModelShape(name="qwen2.5-32b", num_layers=64, hidden=5120, ffn_hidden=27648, num_heads=40,
                   num_kv_heads=8, vocab=152064),
        ModelShape(name="mixtral-8x7b", num_layers=32, hidden=4096, ffn_hidden=0, num_heads=32,
                   num_kv_heads=8, vocab=32000, num_experts=8, experts_per_token=2, expert_ffn=14336),
        ModelShape(name="olmoe-1b-7b", num_layers=16, hidden=2048, ffn_hidden=0, num_heads=16,
                   num_kv_heads=16, vocab=50304, num_experts=64, experts_per_token=8, expert_ffn=1024),
        ModelShape(name="qwen1.5-moe-a2.7b", num_layers=24, hidden=2048, ffn_hidden=0, num_heads=16,
                   num_kv_heads=16, vocab=151936, num_experts=60, experts_per_token=4, expert_ffn=1408,
                   shared_expert_ffn=5632),
        # Two shared experts of width 1408 as one of 2816; its first, dense layer is priced as MoE.
        ModelShape(name="deepseek-moe-16b", num_layers=28, hidden=2048, ffn_hidden=0, num_heads=16,
                   num_kv_heads=16, vocab=102400, num_experts=64, experts_per_token=6, expert_ffn=1408,
                   shared_expert_ffn=2816),
        # Shapes like the paper's four workloads (public configs where known, else plausible).
        ModelShape(name="qwen-9b-dense", num_layers=40, hidden=4096, ffn_hidden=12288, num_heads=32,
                   num_kv_heads=8, vocab=151936),
        ModelShape(name="dense-27b", num_layers=62, hidden=5376, ffn_hidden=21504, num_heads=32,
                   num_kv_heads=16, head_dim=128, vocab=262144, tied_embeddings=True),
        ModelShape(name="gemma-26b-a4b-moe", num_layers=30, hidden=3072, ffn_hidden=0, num_heads=16,
                   num_kv_heads=8, head_dim=256, vocab=262144, tied_embeddings=True, num_experts=128,
                   experts_per_token=8, expert_ffn=704, shared_expert_ffn=2048),
        ModelShape(name="qwen-35b-a3b-moe", num_layers=40, hidden=2048, ffn_hidden=0, num_heads=16,
                   num_kv_heads=2, head_dim=256, vocab=248320, num_experts=256, experts_per_token=8,
                   expert_ffn=512, shared_expert_ffn=512),
        # Runs anywhere in microseconds; for tests.
        ModelShape(name="debug", num_layers=4, hidden=64, ffn_hidden=256, num_heads=4, num_kv_heads=4,
                   vocab=512),
        ModelShape(name="debug-moe", num_layers=4, hidden=64, ffn_hidden=0, num_heads=4, num_kv_heads=4,
                   vocab=512, num_experts=8, experts_per_token=2, expert_ffn=64),
    ]
}


def model_shape(name: str) -> ModelShape:
    if name not in _MODELS:
        raise SpecError(f"unknown model shape {name!r}; choose one of {sorted(_MODELS)}")
    return _MODELS[name]


def model_shape_names() -> list[str]:
    return sorted(_MODELS)
