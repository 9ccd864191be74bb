"""A small character-level GPT trainer in the style of nanoGPT, written without infrarsi.

    python train.py --batch_size=4 --gradient_accumulation_steps=8 --max_iters=20
    python train.py my_config.py --dtype=bfloat16

Settings are module-level names below; a ``.py`` argument is executed to override them
and each ``--key=value`` argument overrides one (the value is read as a Python literal
when it parses as one, and must keep the default's type). It prints its own log lines
(tokens per iteration, ``iter N: loss X, time Y ms``, periodic ``val loss``) and knows
nothing about whoever reads them.

What is trained is fixed by the data, the model size, the global batch (batch_size x
gradient_accumulation_steps sequences of block_size characters), the learning rate and
the seed: each optimizer step draws its global batch from its own seeded generator and
splits it into micro-batches, so a different split trains on the same sequences.
"""

import ast
import sys
import time
from contextlib import nullcontext

import torch
import torch.nn as nn
from torch.nn import functional as F

# ---- settings (override with a config file or --key=value) ----
seed = 1337
max_iters = 20
eval_interval = 10
eval_iters = 2
eval_batch_size = 8
log_interval = 1
batch_size = 2  # sequences per micro-batch
gradient_accumulation_steps = 8
block_size = 64
n_layer = 2
n_head = 2
n_embd = 64
learning_rate = 1e-3
dtype = "float32"  # float32 | bfloat16 (autocast)
compile = False
threads = 0  # 0: leave torch's default
corpus_chars = 100_000
# ----------------------------------------------------------------


def configure(argv: list[str]) -> None:
    """Apply config files and --key=value overrides to the settings above."""
    names = {k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))}
    for arg in argv:
        if not arg.startswith("--"):
            with open(arg) as f:
                exec(f.read(), globals())
            continue
        key, sep, raw = arg[2:].partition("=")
        if not sep or key not in names:
            sys.exit(f"unknown setting {arg!r}: expected --key=value with key one of {sorted(names)}")
        try:
            value = ast.literal_eval(raw)
        except (SyntaxError, ValueError):
            value = raw
        old = globals()[key]
        if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not type(old):
            sys.exit(f"setting {key}: expected {type(old).__name__}, got {value!r}")
        print(f"Overriding: {key} = {value!r}")
        globals()[key] = value


def make_corpus(num_chars: int) -> str:
    """Deterministic text with some structure to learn: sentences from a tiny grammar."""
    g = torch.Generator().manual_seed(7)
    subjects = ["the cat", "a dog", "my friend", "the old man", "a bird", "the child"]
    verbs = ["sees", "likes", "follows", "finds", "hears", "draws"]
    objects = ["the river", "a red ball", "the moon", "some bread", "the garden", "a small boat"]
    parts, size = [], 0
    while size < num_chars:
        pick = [int(torch.randint(len(w), (1,), generator=g)) for w in (subjects, verbs, objects)]
        sentence = f"{subjects[pick[0]]} {verbs[pick[1]]} {objects[pick[2]]}. "
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)[:num_chars]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class CharGPT(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head) for _ in range(n_layer)])
        self.norm = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        logits = self.head(self.norm(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main() -> None:
    configure(sys.argv[1:])
    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    text = make_corpus(corpus_chars)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
    print(f"tokens per iteration will be: {tokens_per_iter:,}")

    def batch(source: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.stack([source[i:i + block_size] for i in rows.tolist()])
        y = torch.stack([source[i + 1:i + 1 + block_size] for i in rows.tolist()])
        return x, y

    model = CharGPT(len(chars))
    print(f"number of parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M")
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    step_model = torch.compile(model) if compile else model
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        model.eval()
        g = torch.Generator().manual_seed(seed + 1)  # the same eval batches every time
        out = {}
        for name, source in (("train", train_data), ("val", val_data)):
            losses = []
            for _ in range(eval_iters):
                rows = torch.randint(len(source) - block_size - 1, (eval_batch_size,), generator=g)
                with ctx:
                    losses.append(step_model(*batch(source, rows)).item())
            out[name] = sum(losses) / len(losses)
        model.train()
        return out

    t0 = time.time()
    for it in range(max_iters):
        if it % eval_interval == 0:
            losses = estimate_loss()
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        g = torch.Generator().manual_seed(seed * 100_003 + it)
        rows = torch.randint(len(train_data) - block_size - 1, (batch_size * gradient_accumulation_steps,), generator=g)
        for micro in range(gradient_accumulation_steps):
            with ctx:
                loss = step_model(*batch(train_data, rows[micro * batch_size:(micro + 1) * batch_size]))
                loss = loss / gradient_accumulation_steps
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t1 = time.time()
        if it % log_interval == 0:
            # like nanoGPT: the last micro-batch's loss, scaled back up
            lossf = loss.item() * gradient_accumulation_steps
            print(f"iter {it}: loss {lossf:.4f}, time {(t1 - t0) * 1000:.2f} ms", flush=True)
        t0 = t1
    losses = estimate_loss()
    print(f"step {max_iters}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")


if __name__ == "__main__":
    main()
