"""Alpha-beta cost of NCCL collectives, vectorised over configs.

Ring algorithms (Thakur, Rabenseifner & Gropp 2005; the NCCL "bus bandwidth" convention
of nccl-tests/PERFORMANCE.md): for ``n`` ranks and ``B`` bytes per rank

- all-reduce:      ``2 (n-1)/n * B / bw + 2 (n-1) * alpha``
- all-gather,
  reduce-scatter:  ``(n-1)/n * B / bw + (n-1) * alpha``   (``B`` = the full, gathered size)
- all-to-all:      ``(n-1)/n * B / bw + (n-1) * alpha``
- point-to-point:  ``B / bw + alpha``

A group is inside one node when its ranks fit in one node: Megatron orders ranks
tp (fastest) - dp/ep - pp, so a group with rank stride ``stride`` and size ``n`` stays on
NVLink iff ``stride * n <= gpus_per_node``; otherwise its ring crosses the network and
runs at the slower per-GPU network bandwidth.
"""

from __future__ import annotations

import numpy as np

from infrarsi.sim.hardware import Hardware


def _link(hw: Hardware, n: np.ndarray, stride: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    inside = n * stride <= hw.gpus_per_node
    bw = np.where(inside, hw.nvlink_bytes_per_s, hw.network_bytes_per_s)
    alpha = np.where(inside, hw.nvlink_latency_s, hw.network_latency_s)
    return bw, alpha


def all_reduce_s(hw: Hardware, nbytes, n, stride) -> np.ndarray:
    n = np.asarray(n, dtype=float)
    bw, alpha = _link(hw, n, np.asarray(stride))
    t = 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * alpha
    return np.where((n > 1) & (np.asarray(nbytes) > 0), t, 0.0)  # nothing to send: no call


def all_gather_s(hw: Hardware, nbytes, n, stride) -> np.ndarray:
    """Also reduce-scatter: the same traffic in the other direction."""
    n = np.asarray(n, dtype=float)
    bw, alpha = _link(hw, n, np.asarray(stride))
    t = (n - 1) / n * nbytes / bw + (n - 1) * alpha
    return np.where((n > 1) & (np.asarray(nbytes) > 0), t, 0.0)  # nothing to send: no call


reduce_scatter_s = all_gather_s
all_to_all_s = all_gather_s


def p2p_s(hw: Hardware, nbytes, stride) -> np.ndarray:
    bw, alpha = _link(hw, np.asarray(2.0), np.asarray(stride))
    return nbytes / bw + alpha
