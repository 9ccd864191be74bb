"""An accumulate-then-step trainer in nanoGPT's style, for `infrarsi init`'s tests.

Settings are module-level names; each `.py` argument is executed over them, then each
`--key=value` overrides one (nanoGPT's configurator). Every optimizer step draws its global
batch (batch_size x gradient_accumulation_steps sequences) from its own seeded generator,
runs it as micro-batches and prints the *last* micro-batch's loss, as nanoGPT does, for
iterations 0..max_iters inclusive. The data opens with a constant stretch: the first
step's sequences are all the same, so its printed loss is the same under every split of the
batch; later steps' are not.
"""

import ast
import sys

import torch

batch_size = 4
gradient_accumulation_steps = 4
block_size = 16
max_iters = 10
vocab = 32
n_embd = 32
learning_rate = 3e-3

for arg in sys.argv[1:]:
    if not arg.startswith("--"):
        exec(open(arg).read())
        continue
    key, _, raw = arg[2:].partition("=")
    if key not in globals():
        sys.exit(f"Unknown config key: {key}")
    globals()[key] = ast.literal_eval(raw)

torch.manual_seed(0)
data = torch.randint(0, vocab, (20_000,), generator=torch.Generator().manual_seed(1))
data[: 4 * block_size] = 7  # the constant opening stretch
model = torch.nn.Sequential(torch.nn.Embedding(vocab, n_embd), torch.nn.Linear(n_embd, n_embd), torch.nn.GELU(),
                            torch.nn.Linear(n_embd, vocab))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
sequences = batch_size * gradient_accumulation_steps
print(f"tokens per iteration will be: {sequences * block_size:,}")
print(f"number of parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M")
for it in range(max_iters + 1):
    g = torch.Generator().manual_seed(100 + it)
    starts = torch.zeros(sequences, dtype=torch.long) if it == 0 else torch.randint(
        0, len(data) - block_size - 1, (sequences,), generator=g)
    x = torch.stack([data[s:s + block_size] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + 1 + block_size] for s in starts.tolist()])
    for micro in range(gradient_accumulation_steps):
        rows = slice(micro * batch_size, (micro + 1) * batch_size)
        logits = model(x[rows])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), y[rows].reshape(-1))
        (loss / gradient_accumulation_steps).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"iter {it}: loss {loss.item():.4f}, time 1.00ms", flush=True)
