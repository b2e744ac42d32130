"""Tokenizers behind one interface: `bytes` (UTF-8 bytes, EOS = 256) or a Hugging Face
`tokenizer.json` (the `tokenizers` library, installed with the `hf` extra), and training a BPE
one offline (`orchestrator prepare --train-tokenizer`).

No torch here: the config's loader asks a tokenizer for its vocabulary size.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, List

import numpy as np

from orchestrator.core.errors import ConfigError

BYTES = "bytes"
EOS_TOKENS = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
"""The end-of-document token of a tokenizer.json is the first of these it holds."""
KEY = "data.tokenizer"


@dataclass(frozen=True)
class Tokenizer:
    key: str
    """Part of every token cache's and shard's key: it changes whenever tokenization would."""
    vocab_size: int
    eos_id: int
    hf: Any = None
    """The `tokenizers.Tokenizer`, or None for bytes."""

    @property
    def dtype(self) -> type:
        """What token files store: uint16 while the ids fit."""
        return np.uint16 if self.vocab_size <= 2**16 else np.uint32

    def encode_batch(self, documents: List[bytes]) -> List[np.ndarray]:
        """Token ids of each document (never EOS: that separates documents)."""
        if self.hf is None:
            return [np.frombuffer(d, dtype=np.uint8).astype(np.uint16) for d in documents]
        texts = [d.decode("utf-8", errors="replace") for d in documents]
        return [np.asarray(e.ids, dtype=self.dtype) for e in self.hf.encode_batch(texts, add_special_tokens=False)]


BYTE_TOKENIZER = Tokenizer("bytes-v1", 257, 256)
TRAINED_FILE = "tokenizer.json"  # what `prepare --train-tokenizer` writes into --out
MAX_TRAINED_VOCAB = 2**20
"""The largest vocabulary `prepare --train-tokenizer` trains: the BPE trainer allocates per
vocabulary entry up front (2**31 asked for 141 GB and aborted the process)."""


def load(spec: str) -> Tokenizer:
    """`bytes`, or the tokenizer.json at path `spec`; ConfigError naming data.tokenizer otherwise."""
    if spec == BYTES:
        return BYTE_TOKENIZER
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(KEY, f"got {spec!r}; no such file; use `bytes` or the path of a Hugging Face tokenizer.json")
    return _load_file(str(path.resolve()), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _load_file(path: str, mtime_ns: int) -> Tokenizer:
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise ConfigError(KEY, f"got {path!r}; a tokenizer.json needs the hf extra: pip install -e '.[hf]'") from None
    raw = Path(path).read_bytes()
    try:
        hf = HFTokenizer.from_str(raw.decode("utf-8"))
    except Exception as exc:  # tokenizers raises its own Exception type for a malformed file
        raise ConfigError(KEY, f"got {path!r}; not a Hugging Face tokenizer.json ({exc})") from None
    eos = next((hf.token_to_id(t) for t in EOS_TOKENS if hf.token_to_id(t) is not None), None)
    if eos is None:
        raise ConfigError(KEY, f"got {path!r}; it has no end-of-document token (one of {', '.join(EOS_TOKENS)})")
    key = "hf-" + hashlib.sha256(raw).hexdigest()[:16]
    return Tokenizer(key, hf.get_vocab_size(with_added_tokens=True), eos, hf)


def train_bpe(texts: Iterable[str], vocab_size: int, out: Path) -> Path:
    """A byte-level BPE tokenizer of `vocab_size` tokens (EOS `<|endoftext|>` included) trained on
    `texts`, written to out/tokenizer.json. Offline: nothing is downloaded."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKENS[0]],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte stays encodable
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    path = out / TRAINED_FILE
    tmp = out / f".tokenizer.json.tmp-{os.getpid()}"
    tok.save(str(tmp))
    os.replace(tmp, path)
    return path
