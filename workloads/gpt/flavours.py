"""Named model flavours of the reference GPT workload.

A flavour fixes *what* is trained (the architecture); the launch knobs in train.py only
change *how* it is run. The harness locks this file so a tuning campaign cannot shrink
the model to win.
"""

from dataclasses import dataclass

__all__ = ["FLAVOURS", "ModelConfig", "get_flavour"]


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
}


def get_flavour(name: str) -> ModelConfig:
    """Return the registered flavour `name`."""
    if name not in FLAVOURS:
        raise ValueError(f"unknown flavour {name!r}; choose one of {sorted(FLAVOURS)}")
    return FLAVOURS[name]
