"""A tiny random-weight Llama and BPE tokenizer that vLLM's CPU build can serve.

No model can be downloaded here, so tests and the vLLM demo build one: a 2-layer Llama
(hidden 128, 2 attention heads of head_dim 64, 1 KV head; the CPU attention kernel
rejects head_dim 16) and a byte-level BPE tokenizer trained on a fixed synthetic corpus.
Both are deterministic (fixed seed, fixed corpus) and cached in the output directory.

Run inside the vLLM virtual environment (it needs ``torch``, ``transformers`` and
``tokenizers``, which vLLM depends on)::

    python -m tokenpath.instrumentation.vllm.tiny_model OUTDIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# Bump when anything below changes so cached directories are rebuilt.
TINY_MODEL_VERSION = 1
STAMP_FILE = ".tokenpath-tiny-model.json"
MODEL_NAME = "tokenpath-tiny-llama"

VOCAB_SIZE = 512
HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 256
NUM_LAYERS = 2
NUM_ATTENTION_HEADS = 2  # head_dim = 128 / 2 = 64
NUM_KV_HEADS = 1
MAX_POSITIONS = 2048
SEED = 0
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
_CORPUS_TEXT = (
    "the request travels through the gateway router scheduler and engine while the cache "
    "keeps prefix blocks warm so that prefill work is saved and decode steps stream tokens "
    "back to the client over the network with latency cost and dollars per stage measured "
    "system prompt user assistant you are a helpful model answer briefly question about "
    "tokens batches kernels memory bandwidth queue time first token"
)


def is_built(out_dir: Path) -> bool:
    """True when ``out_dir`` holds a tiny model built by this version of the builder."""
    stamp = out_dir / STAMP_FILE
    try:
        return int(json.loads(stamp.read_text())["version"]) == TINY_MODEL_VERSION
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _corpus() -> list[str]:
    """A fixed synthetic corpus: every word, pairs and short sentences, no randomness."""
    words = _CORPUS_TEXT.split()
    lines = [" ".join(words)]
    for i, word in enumerate(words):
        lines.append(f"{word} {words[(i * 7 + 3) % len(words)]} {words[(i * 13 + 5) % len(words)]}")
    lines.extend(f"Request {n}: question {n * 17 % 101} about tokens." for n in range(200))
    return lines


def _build_tokenizer(out_dir: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token=SPECIAL_TOKENS[0],
        bos_token=SPECIAL_TOKENS[1],
        eos_token=SPECIAL_TOKENS[2],
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return int(tokenizer.get_vocab_size())


def _build_model(out_dir: Path, vocab_size: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_ATTENTION_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model: Any = LlamaForCausalLM(config)
    model.save_pretrained(str(out_dir), safe_serialization=True)


def build_tiny_model(out_dir: Path) -> Path:
    """Build (or reuse) the tiny model in ``out_dir``; return the directory."""
    out_dir = Path(out_dir)
    if is_built(out_dir):
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = _build_tokenizer(out_dir)
    _build_model(out_dir, vocab_size)
    (out_dir / STAMP_FILE).write_text(
        json.dumps({"version": TINY_MODEL_VERSION, "vocab_size": vocab_size})
    )
    return out_dir


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tokenpath.instrumentation.vllm.tiny_model OUTDIR", file=sys.stderr)
        return 2
    print(build_tiny_model(Path(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
