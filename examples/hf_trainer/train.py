"""Train a tiny GPT-2 with the Hugging Face Trainer on synthetic tokens, written without infrarsi.

    python train.py --output_dir out --per_device_train_batch_size 4 --gradient_accumulation_steps 2 \\
        --max_steps 8 --logging_steps 1 --use_cpu True --report_to none

The model is built from a ``GPT2Config`` (nothing is downloaded); the data is a seeded
stream of token sequences with a learnable pattern. Every ``TrainingArguments`` flag works
as usual; ``--n_layer``, ``--n_embd``, ``--seq_len`` and friends size the model and data.
The Trainer prints its own log lines (``{'loss': ..., 'grad_norm': ...}``).
"""

from dataclasses import dataclass, field

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    n_layer: int = field(default=2, metadata={"help": "transformer blocks"})
    n_embd: int = field(default=64, metadata={"help": "hidden size"})
    n_head: int = field(default=2, metadata={"help": "attention heads"})
    vocab_size: int = field(default=128, metadata={"help": "tokens in the vocabulary"})


@dataclass
class DataArguments:
    seq_len: int = field(default=64, metadata={"help": "tokens per training sequence"})
    num_sequences: int = field(default=2048, metadata={"help": "sequences in the synthetic training set"})
    data_seed_value: int = field(default=0, metadata={"help": "seed of the synthetic data"})


class PatternTokens(torch.utils.data.Dataset):
    """Sequences of an arithmetic progression modulo the vocabulary with a random start and
    stride, so the next token is predictable from the previous two."""

    def __init__(self, data: DataArguments, vocab_size: int) -> None:
        g = torch.Generator().manual_seed(data.data_seed_value)
        start = torch.randint(vocab_size, (data.num_sequences, 1), generator=g)
        stride = torch.randint(1, 8, (data.num_sequences, 1), generator=g)
        self.tokens = (start + stride * torch.arange(data.seq_len)) % vocab_size

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def main() -> None:
    model_args, data_args, training_args = HfArgumentParser(
        (ModelArguments, DataArguments, TrainingArguments)).parse_args_into_dataclasses()
    config = GPT2Config(n_layer=model_args.n_layer, n_embd=model_args.n_embd, n_head=model_args.n_head,
                        vocab_size=model_args.vocab_size, n_positions=data_args.seq_len,
                        bos_token_id=0, eos_token_id=0,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(training_args.seed)
    model = GPT2LMHeadModel(config)
    trainer = Trainer(model=model, args=training_args, train_dataset=PatternTokens(data_args, config.vocab_size))
    trainer.train()


if __name__ == "__main__":
    main()
