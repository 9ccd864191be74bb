"""A Hugging Face Trainer script on a tiny GPT-2 built from a config (no download), with
infrarsi's callback; at the end it writes the Trainer's own log history to --history."""

import argparse
import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from infrarsi.job.hf import InfrarsiCallback

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--out", required=True)
p.add_argument("--history", required=True)
args = p.parse_args()
SEQ, VOCAB = 32, 128

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=SEQ))
data = torch.randint(0, VOCAB, (64, SEQ), generator=torch.Generator().manual_seed(1))
train = [{"input_ids": row, "labels": row} for row in data]
training = TrainingArguments(
    output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=4, gradient_accumulation_steps=2,
    learning_rate=1e-3, logging_steps=50, eval_strategy="steps", eval_steps=3, per_device_eval_batch_size=8,
    save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
    include_num_input_tokens_seen="all", seed=0)
trainer = Trainer(model=model, args=training, train_dataset=train, eval_dataset=train[:8],
                  callbacks=[InfrarsiCallback(seq_len=SEQ)])
trainer.train()
with open(args.history, "w") as f:
    json.dump(trainer.state.log_history, f)
