"""Tiny, download-free inputs for training programs written outside this project.

Each builder writes a random-weight model, a tokenizer, a text corpus and (where the trainer
takes one) a config file under `folder`, and returns a `Launch`: the command as the trainer's
authors publish it, typed as a user would in `folder` (relative paths, the console script by
name), and the variables to add to the environment (the offline switches and a PATH that
finds the console scripts of this interpreter's environment, as an activated venv would).

tests/third_party/README.md has the install and what each trainer prints.
Heavy imports (torch, transformers, tokenizers, sentencepiece, litdata) happen inside the
builders that need them, so importing this module costs nothing.
"""

import json
import os
import random
import sys
from pathlib import Path
from typing import NamedTuple

NUM_STEPS = 3
SEQ_LEN = 32
MICRO_BATCH = 4
GRAD_ACCUM = 2
TOKENS_PER_STEP = MICRO_BATCH * GRAD_ACCUM * SEQ_LEN
_NUM_WORDS = 200
_SPECIAL_TOKENS = ["<unk>", "<pad>", "<s>", "</s>"]

# Every hub client these trainers use refuses the network with these set: a run that still
# tried to download fails instead of fetching.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}


class Launch(NamedTuple):
    """A user's launch command: run `argv` with `cwd` as working folder and `env` added to os.environ."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path


def _env(**extra: str) -> dict[str, str]:
    scripts_dir = str(Path(sys.executable).parent)
    return {**OFFLINE_ENV, "PATH": scripts_dir + os.pathsep + os.environ.get("PATH", ""), **extra}


def _words(seed: int = 0) -> list[str]:
    """A fixed vocabulary of made-up words, so the tokenizer and corpus are the same on every run."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "tu", "re", "sa", "no", "vi", "de", "po", "xi", "gu"]
    words: set[str] = set()
    while len(words) < _NUM_WORDS:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))))
    return sorted(words)


def corpus_lines(num_lines: int = 256, seed: int = 1) -> list[str]:
    """Lines of 40-80 made-up words: each fills a SEQ_LEN window, so every step trains on TOKENS_PER_STEP."""
    rng = random.Random(seed)
    vocab = _words()
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(40, 80))) for _ in range(num_lines)]


def hf_vocab_size() -> int:
    return len(_SPECIAL_TOKENS) + _NUM_WORDS


def write_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer saved as a Hugging Face fast tokenizer (tokenizer.json, tokenizer_config.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(_SPECIAL_TOKENS + _words())}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>",
                                   bos_token="<s>", eos_token="</s>")
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    return folder


def write_hf_model(folder: Path, num_tokens: int | None = None, tie_word_embeddings: bool = True) -> Path:
    """A two-layer Llama with random weights, as `save_pretrained` writes it (config.json, model.safetensors)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=num_tokens or hf_vocab_size(), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=SEQ_LEN * 2, bos_token_id=2, eos_token_id=3, pad_token_id=1,
                         tie_word_embeddings=tie_word_embeddings)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def write_jsonl_dataset(folder: Path) -> Path:
    """A dataset folder holding `train.jsonl` of {"text": ...} rows (what `datasets.load_dataset(folder)` reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w") as f:
        for line in corpus_lines():
            f.write(json.dumps({"text": line}) + "\n")
    return folder


def trl_sft(folder: Path) -> Launch:
    """`trl sft` (TRL's command line, run through `accelerate launch`) on a local model and dataset folder.

    Prints one `{'loss': '5.147', ...}` dict per optimizer step (4 significant digits) and the
    tokens seen so far (`'num_tokens': '256'`); reads model/ and data/train.jsonl, writes out/
    and the datasets cache under HF_HOME.
    """
    folder = Path(folder)
    write_hf_model(folder / "model")
    write_tokenizer(folder / "model")  # one folder with weights and tokenizer, as a model on the Hub
    write_jsonl_dataset(folder / "data")
    argv = ["trl", "sft", "--model_name_or_path", "model", "--dataset_name", "data", "--output_dir", "out",
            "--per_device_train_batch_size", str(MICRO_BATCH), "--gradient_accumulation_steps", str(GRAD_ACCUM),
            "--max_length", str(SEQ_LEN), "--max_steps", str(NUM_STEPS), "--learning_rate", "1e-3",
            "--logging_steps", "1", "--seed", "0", "--bf16", "false", "--use_cpu", "--report_to", "none",
            "--save_strategy", "no", "--dataloader_num_workers", "0"]
    return Launch(argv, _env(), folder)


_LITGPT_CONFIG = """\
model_name: tiny-llama
model_config:
  name: tiny-llama
  block_size: {seq_len}
  vocab_size: {num_tokens}
  padding_multiple: 64
  n_layer: 2
  n_head: 2
  n_embd: 32
  n_query_groups: 2
  rotary_percentage: 1.0
  parallel_residual: false
  bias: false
  norm_class_name: RMSNorm
  mlp_class_name: LLaMAMLP
  intermediate_size: 64
optimizer:
  class_path: torch.optim.AdamW
  init_args:
    lr: 0.001
train:
  micro_batch_size: 1
  global_batch_size: 512
  max_tokens: 3000000000000
"""


def litgpt_pretrain(folder: Path, pretokenize: bool = True, compile_model: bool = False) -> Launch:
    """`litgpt pretrain --config pretrain.yaml` with the TextFiles data module on local .txt files.

    The run stops on `--train.max_tokens` (iterations = max_tokens // (micro_batch x block_size);
    `--train.max_steps` is only warned about in litgpt 0.5.13) and prints one
    `Epoch 1 | iter 2 step 1 | loss train: 5.700, ...` line per optimizer step.

    pretokenize: write data/train and data/val as TextFiles' first run would (litdata's chunk
        format, byte-identical), so the run skips litdata's `optimize`, which spawns worker
        processes that re-import litgpt and costs about 30 s per split here.
    compile_model: litgpt compiles the model unconditionally; False adds TORCHDYNAMO_DISABLE=1
        to the environment (a cold inductor compile costs about 40 s here).
    """
    folder = Path(folder)
    write_tokenizer(folder / "tokenizer")
    data_dir = folder / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    lines = corpus_lines()
    # Without --data.val_data_path, TextFiles validates on the first .txt file (sorted) and trains on the rest.
    (data_dir / "a_val.txt").write_text("\n".join(lines[:32]) + "\n")
    (data_dir / "b_train.txt").write_text("\n".join(lines[32:]) + "\n")
    if pretokenize:
        _litdata_tokens(folder / "tokenizer", data_dir / "a_val.txt", data_dir / "val")
        _litdata_tokens(folder / "tokenizer", data_dir / "b_train.txt", data_dir / "train")
    # The config file holds a full-size run's batch and token budget; the command line overrides them.
    (folder / "pretrain.yaml").write_text(_LITGPT_CONFIG.format(seq_len=SEQ_LEN, num_tokens=hf_vocab_size()))
    argv = ["litgpt", "pretrain", "--config", "pretrain.yaml", "--tokenizer_dir", "tokenizer",
            "--data", "TextFiles", "--data.train_data_path", "data", "--data.num_workers", "0",
            "--out_dir", "out", "--precision", "32-true",
            "--train.micro_batch_size", str(MICRO_BATCH), "--train.global_batch_size", str(MICRO_BATCH * GRAD_ACCUM),
            "--train.max_tokens", str(NUM_STEPS * TOKENS_PER_STEP), "--train.log_interval", "1",
            "--train.lr_warmup_steps", "0", "--eval.final_validation", "false", "--logger_name", "csv",
            "--seed", "0"]
    return Launch(argv, _env() if compile_model else _env(TORCHDYNAMO_DISABLE="1"), folder)


def _litdata_tokens(tokenizer_dir: Path, text_file: Path, out_dir: Path) -> None:
    """One text file as TextFiles writes it: the whole file encoded with BOS, one item of int32 tokens."""
    import torch
    from litdata.streaming.item_loader import TokensLoader
    from litdata.streaming.writer import BinaryWriter
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    bos_id = tokenizer.token_to_id("<s>")
    tokens = [bos_id] + tokenizer.encode(text_file.read_text().strip()).ids
    out_dir.mkdir(parents=True, exist_ok=True)
    # TextFiles passes block_size = max_seq_length + 1; the chunk bytes do not depend on it.
    writer = BinaryWriter(str(out_dir), chunk_bytes="50MB", item_loader=TokensLoader(block_size=SEQ_LEN + 1))
    writer.add_item(0, torch.tensor(tokens, dtype=torch.int))
    writer.done()
    writer.merge(num_workers=1)


def write_sentencepiece(folder: Path, num_tokens: int) -> Path:
    """A SentencePiece BPE model trained on the corpus (what torchtune's llama2_tokenizer loads)."""
    import sentencepiece

    folder.mkdir(parents=True, exist_ok=True)
    text_file = folder / "corpus.txt"
    text_file.write_text("\n".join(corpus_lines()) + "\n")
    # No pad piece: torchtune's Llama2Tokenizer pads with id 0, as for Meta's own tokenizer.model.
    sentencepiece.SentencePieceTrainer.train(
        input=str(text_file), model_prefix=str(folder / "tokenizer"), vocab_size=num_tokens, model_type="bpe",
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2)
    text_file.unlink()
    return folder / "tokenizer.model"


_TORCHTUNE_CONFIG = """\
output_dir: out
model:
  _component_: torchtune.models.llama2.llama2
  vocab_size: {num_tokens}
  num_layers: 2
  num_heads: 2
  num_kv_heads: 2
  embed_dim: 32
  intermediate_dim: 64
  max_seq_len: {max_seq_len}
tokenizer:
  _component_: torchtune.models.llama2.llama2_tokenizer
  path: model/tokenizer.model
  max_seq_len: null
  prompt_template: null
dataset:
  _component_: torchtune.datasets.text_completion_dataset
  source: json
  data_files: data/train.jsonl
  column: text
  split: train
  packed: false
seed: null
shuffle: true
checkpointer:
  _component_: torchtune.training.FullModelHFCheckpointer
  checkpoint_dir: model
  checkpoint_files: [model.safetensors]
  recipe_checkpoint: null
  output_dir: ${{output_dir}}
  model_type: LLAMA2
resume_from_checkpoint: false
batch_size: 2
epochs: 1
max_steps_per_epoch: null
gradient_accumulation_steps: 1
optimizer:
  _component_: torch.optim.AdamW
  lr: 1e-3
loss:
  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss
optimizer_in_bwd: false
clip_grad_norm: null
compile: false
device: cpu
enable_activation_checkpointing: false
enable_activation_offloading: false
dtype: bf16
metric_logger:
  _component_: torchtune.training.metric_logging.StdoutLogger
log_every_n_steps: 1
log_peak_memory_stats: false
profiler:
  _component_: torchtune.training.setup_torch_profiler
  enabled: false
"""


def torchtune_full_finetune(folder: Path) -> Launch:
    """`tune run full_finetune_single_device --config finetune.yaml key=value ...` on a local Llama-2-shaped
    Hugging Face checkpoint, its SentencePiece tokenizer and a JSON-lines text dataset.

    The config file holds a full-size run's values; the `key=value` overrides (OmegaConf, later
    ones win) set the tiny run. Prints one `Step 1 | loss:5.541815757751465 lr:0.001
    tokens_per_second_per_gpu:...` line per optimizer step, at full float precision.
    """
    folder = Path(folder)
    num_tokens = 256
    write_hf_model(folder / "model", num_tokens=num_tokens, tie_word_embeddings=False)
    write_sentencepiece(folder / "model", num_tokens)
    write_jsonl_dataset(folder / "data")
    (folder / "finetune.yaml").write_text(_TORCHTUNE_CONFIG.format(num_tokens=num_tokens, max_seq_len=SEQ_LEN * 2))
    argv = ["tune", "run", "full_finetune_single_device", "--config", "finetune.yaml",
            f"batch_size={MICRO_BATCH}", f"gradient_accumulation_steps={GRAD_ACCUM}",
            f"tokenizer.max_seq_len={SEQ_LEN}", f"max_steps_per_epoch={NUM_STEPS}", "dtype=fp32", "seed=0"]
    return Launch(argv, _env(), folder)


def torchtitan_train(folder: Path) -> Launch:
    """torchtitan's llama3 debug model through `torchrun -m torchtitan.train`, its tokenizer and dataset local.

    torchtitan 0.3.0 does not run on a CPU-only machine: with no accelerator it still selects a
    `cuda` device (torchtitan/tools/utils.py) and fails in `torch.cuda.set_device`. Kept for a
    machine with a GPU; its test skips without one.
    """
    folder = Path(folder)
    write_tokenizer(folder / "tokenizer")
    write_jsonl_dataset(folder / "data")
    argv = ["torchrun", "--nproc_per_node", "1", "--standalone", "-m", "torchtitan.train",
            "--module", "llama3", "--config", "llama3_debugmodel",
            "--hf-assets-path", "tokenizer", "--dataloader.dataset", "c4_test", "--dataloader.dataset-path", "data",
            "--training.steps", str(NUM_STEPS), "--training.local-batch-size", str(MICRO_BATCH),
            "--training.global-batch-size", str(MICRO_BATCH * GRAD_ACCUM), "--training.seq-len", str(SEQ_LEN),
            "--metrics.log-freq", "1", "--checkpoint.no-enable", "--validator.no-enable",
            "--compile.no-enable", "--debug.seed", "0", "--dump-folder", "out"]
    return Launch(argv, _env(), folder)
