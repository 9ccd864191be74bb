"""A Lightning script (a tiny next-token model, gradient accumulation 2) with infrarsi's
callback; at the end it writes the loss of every training_step it ran to --history."""

import argparse
import json

import lightning as L
import torch
from torch import nn

from infrarsi.job.lightning import InfrarsiCallback

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
p.add_argument("--history", required=True)
args = p.parse_args()
SEQ, VOCAB, BATCH = 16, 64, 4


class TinyLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(VOCAB, 32), nn.Linear(32, VOCAB)
        self.micro_losses = []

    def _loss(self, tokens):
        logits = self.head(torch.tanh(self.embed(tokens[:, :-1])))
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.micro_losses.append(loss.item())
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


L.seed_everything(0, verbose=False)
data = torch.randint(0, VOCAB, (80, SEQ), generator=torch.Generator().manual_seed(1))
loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
module = TinyLM()
trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=args.steps, accumulate_grad_batches=2, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    num_sanity_val_steps=0, val_check_interval=4, limit_val_batches=1,
                    callbacks=[InfrarsiCallback(seq_len=SEQ)])
trainer.fit(module, loader, torch.utils.data.DataLoader(data[:8], batch_size=8))
with open(args.history, "w") as f:
    json.dump(module.micro_losses, f)
