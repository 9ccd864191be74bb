"""The job's data: a fixed random Markov chain over a small vocabulary, so that there is
something to learn. Batches are a function of (seed, step) alone; the held-out batches
of the evaluation are fixed."""

import torch

VOCAB = 64


def _chain(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(VOCAB, VOCAB, generator=g) * 2.0
    return torch.softmax(logits, dim=-1)


def _sample(chain: torch.Tensor, num_sequences: int, length: int, g: torch.Generator) -> torch.Tensor:
    out = torch.empty(num_sequences, length, dtype=torch.long)
    out[:, 0] = torch.randint(0, VOCAB, (num_sequences,), generator=g)
    for t in range(1, length):
        out[:, t] = torch.multinomial(chain[out[:, t - 1]], 1, generator=g).squeeze(1)
    return out


def global_batch(seed: int, step: int, num_sequences: int, seq_len: int) -> torch.Tensor:
    """The step's global batch: ``num_sequences`` sequences of ``seq_len + 1`` tokens."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    return _sample(_chain(0), num_sequences, seq_len + 1, g)


def held_out(num_sequences: int, seq_len: int) -> torch.Tensor:
    return _sample(_chain(0), num_sequences, seq_len + 1, torch.Generator().manual_seed(987_654))
