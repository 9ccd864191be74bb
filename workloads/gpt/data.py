"""The synthetic corpus the GPT workload trains on, and the count of tokens it serves.

LOCKED by the harness: this file defines what is trained on, and its token counter is
what the metrics module reports, so a tuned trainer cannot claim more tokens than it
was actually handed.

The corpus is generated at run time from a seed, so runs need no files. Text comes from
a fixed random sparse Markov chain (each token has a few likely successors, and those
successors favour a small set of common tokens) interrupted now and then by one of a few
fixed motifs copied verbatim. Its entropy is far below log(vocab_size), so even a tiny
GPT's loss falls clearly within ten or twenty steps: first as it learns which tokens are
common, then the successor table, then the motifs.

Batch s is a pure function of (seed, vocab_size, seq_len, global_batch_sequences, s):
however a run splits it across ranks and micro-steps, the global batch is the same.
"""

import numpy as np
import torch

__all__ = ["SyntheticCorpus"]

NUM_SUCCESSORS = 4  # the chain's out-degree: a token can be followed by only 4 tokens
SUCCESSOR_PROBS = (0.55, 0.25, 0.12, 0.08)
ZIPF_EXPONENT = 1.1  # how strongly successors concentrate on the common tokens
NUM_MOTIFS = 16
MOTIF_LEN = 12
MOTIF_START_PROB = 0.04  # chance, per position outside a motif, that a motif begins

# Independent random streams drawn from one seed.
_STRUCTURE_STREAM = 0
_BATCH_STREAM = 1


class SyntheticCorpus:
    """Serves each optimizer step's global batch of token sequences.

    Every rank builds the whole global batch of a step (it is cheap) and takes its own
    rows, so no communication is needed and the split cannot change the data. Only
    `micro_batch` counts tokens as served; it is the one accessor a trainer should use.
    """

    def __init__(self, *, seed: int, vocab_size: int, seq_len: int, global_batch_sequences: int):
        if vocab_size < NUM_SUCCESSORS:
            raise ValueError(f"vocab_size: expected >= {NUM_SUCCESSORS}, got {vocab_size}")
        self.seed = seed
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.global_batch_sequences = global_batch_sequences
        self.num_tokens_served = 0  # input tokens handed out since the last take

        rng = np.random.default_rng([seed, _STRUCTURE_STREAM])
        popularity = 1.0 / np.arange(1, vocab_size + 1) ** ZIPF_EXPONENT
        popularity = popularity[rng.permutation(vocab_size)]
        popularity /= popularity.sum()
        self._successors = _draw_successors(rng, popularity)
        self._motifs = rng.choice(vocab_size, size=(NUM_MOTIFS, MOTIF_LEN), p=popularity)
        self._popularity = popularity
        self._cached_step: int | None = None
        self._cached_batch: torch.Tensor | None = None

    def global_batch(self, step: int) -> torch.Tensor:
        """Token ids of step `step`'s whole global batch, [global_batch_sequences, seq_len + 1]."""
        if step != self._cached_step:
            self._cached_batch = torch.from_numpy(self._generate(step))
            self._cached_step = step
        return self._cached_batch

    def micro_batch(
        self, *, step: int, rank: int, world_size: int, micro_step: int, micro_batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each [micro_batch, seq_len], for one micro-step of one rank.

        Rank r owns a contiguous block of global_batch_sequences / world_size rows, which
        its micro-steps walk through in order.
        """
        rows_per_rank = self.global_batch_sequences // world_size
        first = rank * rows_per_rank + micro_step * micro_batch
        rows = self.global_batch(step)[first : first + micro_batch]
        if rows.size(0) != micro_batch or micro_step * micro_batch >= rows_per_rank:
            raise IndexError(
                f"micro-step {micro_step} of {micro_batch} sequences on rank {rank}/{world_size} "
                f"lies outside the global batch of {self.global_batch_sequences} sequences"
            )
        inputs = rows[:, :-1].contiguous()
        targets = rows[:, 1:].contiguous()
        self.num_tokens_served += inputs.numel()
        return inputs, targets

    def take_num_tokens_served(self) -> int:
        """Input tokens served since the previous call; resets the count."""
        num_tokens, self.num_tokens_served = self.num_tokens_served, 0
        return num_tokens

    def _generate(self, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, _BATCH_STREAM, step])
        num_rows, length = self.global_batch_sequences, self.seq_len + 1
        # Draw every random number up front so the per-position loop is plain indexing.
        successor_slot = rng.choice(NUM_SUCCESSORS, size=(num_rows, length), p=SUCCESSOR_PROBS)
        motif_start = rng.random((num_rows, length)) < MOTIF_START_PROB
        motif_choice = rng.integers(NUM_MOTIFS, size=(num_rows, length))

        tokens = np.empty((num_rows, length), dtype=np.int64)
        tokens[:, 0] = rng.choice(self.vocab_size, size=num_rows, p=self._popularity)
        motif = np.full(num_rows, -1)  # motif being copied per row, -1 = none
        motif_pos = np.zeros(num_rows, dtype=np.int64)
        for t in range(1, length):
            starting = (motif < 0) & motif_start[:, t]
            motif[starting] = motif_choice[starting, t]
            in_motif = motif >= 0
            chain_next = self._successors[tokens[:, t - 1], successor_slot[:, t]]
            motif_next = self._motifs[motif.clip(min=0), motif_pos]
            tokens[:, t] = np.where(in_motif, motif_next, chain_next)
            motif_pos += in_motif
            finished = motif_pos == MOTIF_LEN
            motif[finished] = -1
            motif_pos[finished] = 0
        return tokens


def _draw_successors(rng: np.random.Generator, popularity: np.ndarray) -> np.ndarray:
    """NUM_SUCCESSORS distinct tokens per token, drawn by popularity: [vocab_size, NUM_SUCCESSORS].

    The same draws, from the same random stream, as calling
    ``rng.choice(vocab_size, size=NUM_SUCCESSORS, replace=False, p=popularity)`` once per
    token (NumPy's algorithm: draw uniforms against the CDF, keep the first occurrence of
    each token, redraw the missing ones with the found tokens' mass removed), but the
    first round's CDF is built once instead of once per token. At a GPT-2 vocabulary
    (50,304 tokens) that is seconds instead of half a minute per process.
    """
    vocab_size = popularity.size
    first_cdf = np.cumsum(popularity)
    first_cdf /= first_cdf[-1]
    successors = np.empty((vocab_size, NUM_SUCCESSORS), dtype=np.int64)
    for token in range(vocab_size):
        found = successors[token]
        num_found = 0
        while num_found < NUM_SUCCESSORS:
            uniforms = rng.random((NUM_SUCCESSORS - num_found,))
            if num_found == 0:
                cdf = first_cdf
            else:
                remaining = popularity.copy()
                remaining[found[:num_found]] = 0
                cdf = np.cumsum(remaining)
                cdf /= cdf[-1]
            drawn = cdf.searchsorted(uniforms, side="right")
            _, first_seen = np.unique(drawn, return_index=True)
            drawn = drawn.take(np.sort(first_seen))
            found[num_found : num_found + drawn.size] = drawn
            num_found += drawn.size
    return successors
