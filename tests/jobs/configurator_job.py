"""A training script in the style of nanoGPT's configurator: positional arguments are
config files executed in order, then ``--key=value`` overrides, later ones winning. It
prints what nanoGPT prints at start-up (tokens per iteration, the parameter count) and one
loss a step for iterations 0..max_iters inclusive; the losses are a deterministic function
of the model it was configured with. No torch: a step is a 20 ms sleep."""

import ast
import math
import sys
import time

n_layer, n_embd, block_size, batch_size, gradient_accumulation_steps, max_iters = 6, 384, 256, 64, 1, 5000
for arg in sys.argv[1:]:
    if not arg.startswith("--"):
        exec(open(arg).read())
        continue
    key, _, raw = arg[2:].partition("=")
    assert key in globals(), f"Unknown config key: {key}"
    globals()[key] = ast.literal_eval(raw)
print(f"tokens per iteration will be: {batch_size * gradient_accumulation_steps * block_size:,}")
params = n_layer * 12 * n_embd * n_embd
print(f"number of parameters: {params / 1e6:.2f}M")
for it in range(max_iters + 1):
    time.sleep(0.02)  # a step the harness can time
    loss = 4.2 + 0.01 * math.log(params) - 0.1 * it / (1 + it)
    print(f"iter {it}: loss {loss:.4f}, time 20.00ms", flush=True)
