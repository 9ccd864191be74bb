"""Data for a checkout of karpathy/nanoGPT, written offline: its `shakespeare_char` dataset
(`data/shakespeare_char/train.bin`, `val.bin`, `meta.pkl`, in the format its own
`prepare.py` writes), from a seeded corpus of made-up words instead of the download.

Used to take nanoGPT through `infrarsi init` and a campaign as a user would (docs/measured.md
says which runs). nanoGPT itself is not part of this project: clone it yourself.

    python benchmarks/nanogpt_data.py PATH/TO/nanoGPT
"""

import argparse
import pickle
import random
from pathlib import Path

import numpy as np


def corpus(num_chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "tu", "re", "sa", "no", "vi", "de", "po", "xi", "gu", "th", "e", "a"]
    words = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(400)})
    out, size = [], 0
    while size < num_chars:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + rng.choice(".,;!?") + "\n"
        out.append(line)
        size += len(line)
    return "".join(out)[:num_chars]


def write(checkout: Path, num_chars: int = 1_000_000) -> Path:
    text = corpus(num_chars)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    split = int(len(ids) * 0.9)
    folder = Path(checkout) / "data" / "shakespeare_char"
    folder.mkdir(parents=True, exist_ok=True)
    ids[:split].tofile(folder / "train.bin")
    ids[split:].tofile(folder / "val.bin")
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a clone of karpathy/nanoGPT")
    print(write(parser.parse_args().checkout))
