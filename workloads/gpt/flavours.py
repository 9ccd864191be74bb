"""Named model flavours of the reference GPT workload.

A flavour fixes *what* is trained (the architecture); the launch knobs in train.py only
change *how* it is run. The harness locks this file so a tuning campaign cannot shrink
the model to win.
"""

from dataclasses import dataclass

__all__ = ["FLAVOURS", "ModelConfig", "flops_per_token", "get_flavour"]


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    vocab_size: int
    num_layers: int
    num_heads: int
    d_model: int
    d_ff: int  # hidden width of the dense MLP, or of each expert when num_experts > 0
    num_experts: int = 0  # 0 = dense MLP in every block
    top_k: int = 2  # experts each token is routed to; ignored when dense
    max_seq_len: int = 256  # size of the learned position table

    def __post_init__(self) -> None:
        for name in ("vocab_size", "num_layers", "num_heads", "d_model", "d_ff", "max_seq_len"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"ModelConfig.{name}: expected a positive integer, got {value}")
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                f"ModelConfig.d_model: expected a multiple of num_heads={self.num_heads}, "
                f"got {self.d_model}"
            )
        if self.num_experts < 0:
            raise ValueError(f"ModelConfig.num_experts: expected >= 0, got {self.num_experts}")
        if self.num_experts > 0 and not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"ModelConfig.top_k: expected 1..num_experts={self.num_experts}, got {self.top_k}"
            )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


FLAVOURS: dict[str, ModelConfig] = {
    # Unit tests: well under 1M parameters, a training step in tens of milliseconds.
    "tiny": ModelConfig(
        vocab_size=256, num_layers=2, num_heads=2, d_model=64, d_ff=256, max_seq_len=128
    ),
    # The reference dense model (~3.4M parameters); max_seq_len leaves room to study
    # longer sequences, where naive attention's T x T matrix starts to dominate.
    "debug": ModelConfig(
        vocab_size=512, num_layers=4, num_heads=4, d_model=256, d_ff=1024, max_seq_len=512
    ),
    # debug with every MLP replaced by 4 routed experts. Each expert is half as wide as
    # the dense MLP so that top-2 routing does about the same work per token as debug.
    "debug-moe": ModelConfig(
        vocab_size=512,
        num_layers=4,
        num_heads=4,
        d_model=256,
        d_ff=512,
        num_experts=4,
        top_k=2,
        max_seq_len=512,
    ),
    # GPU sizes. The GPT-2 small and medium shapes (124M and 355M parameters at seq 1024);
    # the vocabulary is GPT-2's 50,257 padded to a multiple of 64, as tensor cores prefer.
    "gpt2-small": ModelConfig(
        vocab_size=50304, num_layers=12, num_heads=12, d_model=768, d_ff=3072, max_seq_len=1024
    ),
    "gpt2-medium": ModelConfig(
        vocab_size=50304, num_layers=24, num_heads=16, d_model=1024, d_ff=4096, max_seq_len=1024
    ),
    # gpt2-small with every MLP replaced by 8 routed experts, top-2, each expert half as
    # wide as the dense MLP: ~294M parameters, about gpt2-small's work per token.
    "gpt2-small-moe8": ModelConfig(
        vocab_size=50304,
        num_layers=12,
        num_heads=12,
        d_model=768,
        d_ff=1536,
        num_experts=8,
        top_k=2,
        max_seq_len=1024,
    ),
}


def flops_per_token(config: ModelConfig, seq_len: int) -> int:
    """Model FLOPs of one training token (forward and backward) at `seq_len`.

    6 x the parameters each token multiplies (attention and MLP matrices, the routed
    experts' share and the router for MoE, the tied LM head; not the embedding lookups or
    LayerNorm gains) plus 12 x layers x d_model x seq_len for attention's score and value
    products (the PaLM paper's appendix B convention, no causal halving), so recompute and
    implementation choices do not change it.
    """
    d, d_ff = config.d_model, config.d_ff
    mlp = 2 * d * d_ff
    if config.is_moe:
        mlp = config.top_k * mlp + d * config.num_experts
    per_layer = 4 * d * d + mlp
    matrix_params = config.num_layers * per_layer + d * config.vocab_size
    return 6 * matrix_params + 12 * config.num_layers * d * seq_len


def get_flavour(name: str) -> ModelConfig:
    """Return the registered flavour `name`."""
    if name not in FLAVOURS:
        raise ValueError(f"unknown flavour {name!r}; choose one of {sorted(FLAVOURS)}")
    return FLAVOURS[name]
