"""A small GPT (pre-LN, learned positions, tied embeddings), dense or mixture-of-experts.

Two knobs change how the model runs but not what it computes, so a tuner may flip them
freely: the attention implementation and activation checkpointing. There is no dropout,
which keeps a run deterministic and lets any two settings be compared step by step.
"""

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from workloads.gpt.flavours import ModelConfig

__all__ = ["ATTENTION_IMPLEMENTATIONS", "CHECKPOINTING_MODES", "GPT"]

# none: keep every activation. selective: recompute only the attention core (with naive
# attention that is the T x T score matrix, the biggest activation). full: recompute
# each whole block, keeping only block inputs.
CHECKPOINTING_MODES = ("none", "selective", "full")


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention that materialises the full T x T score matrix."""
    seq_len = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    return F.softmax(scores, dim=-1) @ v


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention through PyTorch's fused kernels (flash / memory-efficient)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


ATTENTION_IMPLEMENTATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "naive": naive_attention,
    "sdpa": sdpa_attention,
}


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig, *, attention: str, checkpoint_core: bool):
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.core = ATTENTION_IMPLEMENTATIONS[attention]
        self.checkpoint_core = checkpoint_core

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=2)
        q, k, v = (
            t.view(batch, seq_len, self.num_heads, d_model // self.num_heads).transpose(1, 2)
            for t in (q, k, v)
        )
        if self.checkpoint_core:
            y = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            y = self.core(q, k, v)
        y = y.transpose(1, 2).contiguous().view(batch, seq_len, d_model)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff, bias=False)
        self.fc_out = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))


class MoE(nn.Module):
    """Top-k routed experts; each token's gates are a softmax over its chosen experts."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.top_k = config.top_k
        self.router = nn.Linear(config.d_model, config.num_experts, bias=False)
        self.experts = nn.ModuleList(
            MLP(config.d_model, config.d_ff) for _ in range(config.num_experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, d_model = x.shape
        tokens = x.reshape(-1, d_model)
        top_logits, top_experts = self.router(tokens).topk(self.top_k, dim=-1)
        gates = F.softmax(top_logits, dim=-1)
        out = torch.zeros_like(tokens)
        for index, expert in enumerate(self.experts):
            token_ids, slots = (top_experts == index).nonzero(as_tuple=True)
            # An expert that got no tokens still runs (on an empty batch) so that all
            # parameters join the graph: DDP then needs no unused-parameter search.
            y = expert(tokens[token_ids]) * gates[token_ids, slots].unsqueeze(-1)
            # topk picks distinct experts, so token_ids has no repeats and this
            # scatter is deterministic.
            out.index_add_(0, token_ids, y.to(out.dtype))
        return out.view(batch, seq_len, d_model)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, *, attention: str, checkpoint_attention: bool):
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(
            config, attention=attention, checkpoint_core=checkpoint_attention
        )
        self.ln_mlp = nn.LayerNorm(config.d_model)
        self.mlp = MoE(config) if config.is_moe else MLP(config.d_model, config.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    def __init__(
        self, config: ModelConfig, *, attention: str = "sdpa", checkpointing: str = "none"
    ):
        super().__init__()
        if attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"attention: expected one of {sorted(ATTENTION_IMPLEMENTATIONS)}, got {attention!r}"
            )
        if checkpointing not in CHECKPOINTING_MODES:
            raise ValueError(
                f"checkpointing: expected one of {list(CHECKPOINTING_MODES)}, got {checkpointing!r}"
            )
        self.config = config
        self.checkpoint_blocks = checkpointing == "full"
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.max_seq_len, config.d_model)
        self.blocks = nn.ModuleList(
            Block(config, attention=attention, checkpoint_attention=checkpointing == "selective")
            for _ in range(config.num_layers)
        )
        self.ln_final = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.token_embedding.weight
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2 initialisation; the projections that write into the residual stream are
        # scaled down so the stream's variance does not grow with depth.
        residual_std = 0.02 / math.sqrt(2 * self.config.num_layers)
        for name, param in self.named_parameters():
            if name.endswith(("proj.weight", "fc_out.weight")):
                nn.init.normal_(param, mean=0.0, std=residual_std)
            elif param.dim() >= 2:
                nn.init.normal_(param, mean=0.0, std=0.02)

    @property
    def num_params(self) -> int:
        """Parameter count, the tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of `inputs` [batch, seq_len] against `targets`."""
        positions = torch.arange(inputs.size(1), device=inputs.device)
        x = self.token_embedding(inputs) + self.position_embedding(positions)
        for block in self.blocks:
            if self.checkpoint_blocks:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.lm_head(self.ln_final(x))
        # The loss is taken in fp32 whatever the autocast dtype, so precision knobs
        # only change the forward and backward arithmetic.
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
