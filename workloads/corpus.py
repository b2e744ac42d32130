"""The corpus: sources -> documents -> byte tokens, cached memory-mapped on disk.

Built-in sources need no download (the standard library's source as `code`, the reference
documentation of `pydoc_data` as `prose`, generated `arithmetic`); user sources are .txt,
.jsonl or .parquet files, streamed. Every source is tokenized once into a memory-mapped token
file plus document offsets, so training never holds a corpus in RAM; `prepare_shards` writes
the same files for reuse. Packing and batching are in `workloads/data.py`.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import sys
import sysconfig
import uuid
from array import array
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

import numpy as np
import torch

from orchestrator.config import Config, SourceConfig
from orchestrator.errors import ConfigError

EOS = 256
VOCAB_SIZE = 257
TOKENIZER = "bytes-v1"  # part of every cache key: change it whenever tokenization changes
CODE_DOC_BYTES = 16 * 1024
PROSE_DOC_BYTES = 2 * 1024
ARITHMETIC_DOCS = 4000
ARITHMETIC_SEED = 1234  # the corpus is fixed; train.seed only changes its order
FILE_SUFFIXES = (".txt", ".jsonl", ".parquet")


def encode(text: str) -> np.ndarray:
    """UTF-8 bytes as uint16 token ids (0..255); text never produces EOS."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def decode(tokens: Sequence[int] | np.ndarray | torch.Tensor) -> str:
    """Token ids back to text; EOS separates documents and is not text, so it is dropped."""
    ids = np.asarray(tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= VOCAB_SIZE):
        raise ValueError(f"token ids must lie in [0, {VOCAB_SIZE})")
    return ids[ids != EOS].astype(np.uint8).tobytes().decode("utf-8", errors="replace")


# ---------------------------------------------------------------- sources: documents as bytes


def _pack_pieces(pieces: Sequence[bytes], limit: int) -> Iterator[bytes]:
    """Group consecutive pieces (lines, paragraphs) into documents of at most `limit` bytes."""
    chunk: List[bytes] = []
    size = 0
    for piece in pieces:
        if size and size + len(piece) > limit:
            yield b"".join(chunk)
            chunk, size = [], 0
        while len(piece) > limit:  # a single huge piece (a minified line, say) is sliced
            yield piece[:limit]
            piece = piece[limit:]
        chunk.append(piece)
        size += len(piece)
    if size:
        yield b"".join(chunk)


def _code_documents() -> Iterator[bytes]:
    """The standard library's own .py files (not site-packages: that differs per install)."""
    root, paths = sysconfig.get_paths()["stdlib"], []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__")]
        paths += [os.path.relpath(os.path.join(folder, f), root) for f in files if f.endswith(".py")]
    for rel in sorted(paths):
        yield from _pack_pieces(Path(root, rel).read_bytes().splitlines(keepends=True), CODE_DOC_BYTES)


def _prose_documents() -> Iterator[bytes]:
    """The language reference shipped with every Python, in documents of whole paragraphs."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        paragraphs = [(p + "\n\n").encode("utf-8") for p in topics[name].strip().split("\n\n")]
        yield from _pack_pieces(paragraphs, PROSE_DOC_BYTES)


def _arithmetic_documents() -> Iterator[bytes]:
    """Fixed synthetic sums, differences and products: a learnable signal for tiny models."""
    rng = np.random.default_rng(ARITHMETIC_SEED)
    for _ in range(ARITHMETIC_DOCS):
        lines = []
        for _ in range(int(rng.integers(4, 40))):
            a, b = (int(rng.integers(0, 10 ** int(rng.integers(1, 5)))) for _ in range(2))
            op = "+-*"[int(rng.integers(0, 3))]
            lines.append(f"{a}{op}{b}={a + b if op == '+' else a - b if op == '-' else a * b}\n")
        yield "".join(lines).encode("utf-8")


def resolve_files(src: SourceConfig, key: str) -> List[Path]:
    """The files of a `files` source, sorted; ConfigError if the path names nothing usable."""
    path = src.path or ""
    if any(c in path for c in "*?["):
        files = [Path(p) for p in glob.glob(path, recursive=True)]
    elif os.path.exists(path):
        files = list(Path(path).rglob("*")) if os.path.isdir(path) else [Path(path)]
    else:
        raise ConfigError(f"{key}.path", f"got {path!r}; no such file or directory")
    files = sorted(p.resolve() for p in files if p.is_file() and p.suffix in FILE_SUFFIXES)
    if not files:
        raise ConfigError(f"{key}.path", f"got {path!r}; it holds no {', '.join(FILE_SUFFIXES)} files")
    return files


def _jsonl_texts(path: Path, field: str, key: str) -> Iterator[str]:
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            try:
                text = json.loads(line)[field] if line.strip() else ""
            except (ValueError, KeyError, TypeError):
                raise ConfigError(
                    f"{key}.text_field", f"got {field!r}; {path}:{n} is not a JSON object with that field"
                ) from None
            yield text


def _parquet_texts(path: Path, field: str, key: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    if field not in parquet.schema_arrow.names:
        raise ConfigError(f"{key}.text_field", f"got {field!r}; not a column of {path}")
    for group in range(parquet.num_row_groups):  # one row group in memory at a time
        yield from (text or "" for text in parquet.read_row_group(group, columns=[field]).column(0).to_pylist())


def _files_documents(src: SourceConfig, key: str) -> Iterator[bytes]:
    """Stream a user corpus: a file, line or row group at a time, never a whole corpus in RAM."""
    for path in resolve_files(src, key):
        if path.suffix == ".txt":
            yield path.read_bytes()
            continue
        for text in (_jsonl_texts if path.suffix == ".jsonl" else _parquet_texts)(path, src.text_field, key):
            if not isinstance(text, str):
                raise ConfigError(
                    f"{key}.text_field", f"got {src.text_field!r}; {path} holds a {type(text).__name__} there, not text"
                )
            yield text.encode("utf-8")


def iter_documents(src: SourceConfig, key: str = "data.sources.0") -> Iterator[bytes]:
    """Every non-empty document of a source in a fixed order (an empty one would be a bare EOS)."""
    builtin = {"code": _code_documents, "prose": _prose_documents, "arithmetic": _arithmetic_documents}
    return (d for d in (builtin[src.kind]() if src.kind in builtin else _files_documents(src, key)) if d)


# ---------------------------------------------------------------- token cache and shards


@dataclass
class SourceTokens:
    """One tokenized source: a uint16 memmap of all tokens and int64 document offsets."""

    tokens: np.ndarray
    offsets: np.ndarray
    """num_documents + 1 offsets into `tokens`."""
    canonical: np.ndarray
    """Per document, the index of its first exact copy (itself if unique): the split key."""

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    def document(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[self.offsets[i] : self.offsets[i + 1]])


def hash64(data: bytes | str) -> int:
    return int.from_bytes(
        hashlib.blake2b(data.encode() if isinstance(data, str) else data, digest_size=8).digest(), "little"
    )


def _short_hash(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def _config_hash(src: SourceConfig, cap: int) -> str:
    """What the tokens depend on (not the source's name or weight); shards are checked against it."""
    return _short_hash([src.kind, src.path, src.text_field, cap, TOKENIZER])


def _folder_name(src: SourceConfig) -> str:
    return re.sub(r"[^\w.-]", "_", src.name)


def _cache_dir(src: SourceConfig, cap: int, key: str) -> Path:
    """The cache key adds what the inputs are today (Python version, file sizes and mtimes)."""
    if src.kind == "files":
        inputs = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in resolve_files(src, key)]
    else:
        inputs = [sys.version, sysconfig.get_paths()["stdlib"]]
    root = Path(os.environ.get("ORCHESTRATOR_CACHE_DIR") or Path.cwd() / ".cache" / "tokens")
    return root / f"{_folder_name(src)}-{_short_hash([_config_hash(src, cap), inputs])}"


def _meta_hash(folder: Path) -> Optional[str]:
    meta = folder / "meta.json"
    return json.loads(meta.read_text())["config_hash"] if meta.exists() else None


def _build(src: SourceConfig, key: str, cap: int, final: Path) -> None:
    """Tokenize into a private temp folder, then rename it into place.

    Several workers may build the same cache at once: the first rename wins and the others
    drop their copy, so a reader only ever sees a complete folder (meta.json is written last).
    """
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        offsets, digests, docs = array("q", [0]), array("Q"), iter_documents(src, key)
        with open(tmp / "tokens.bin", "wb") as f:
            for doc in islice(docs, cap) if cap else docs:
                f.write(np.frombuffer(doc, dtype=np.uint8).astype(np.uint16).tobytes())
                offsets.append(offsets[-1] + len(doc))
                digests.append(hash64(doc))
        _, first, inverse = np.unique(np.asarray(digests, np.uint64), return_index=True, return_inverse=True)
        np.save(tmp / "offsets.npy", np.asarray(offsets, np.int64))
        np.save(tmp / "canonical.npy", first[inverse.reshape(-1)].astype(np.int64))
        (tmp / "meta.json").write_text(json.dumps({"name": src.name, "config_hash": _config_hash(src, cap)}))
        try:
            os.rename(tmp, final)
        except OSError:
            if _meta_hash(final) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load(folder: Path) -> SourceTokens:
    offsets = np.load(folder / "offsets.npy")
    n = int(offsets[-1])
    tokens = np.memmap(folder / "tokens.bin", dtype=np.uint16, mode="r", shape=(n,)) if n else np.zeros(0, np.uint16)
    return SourceTokens(tokens, offsets, np.load(folder / "canonical.npy"))


def load_source(cfg: Config, index: int) -> SourceTokens:
    """Source `index`'s tokens: from data.shard_dir if set, else the cache (built on first use)."""
    src, cap, key = cfg.data.sources[index], cfg.data.max_documents_per_source, f"data.sources.{index}"
    if cfg.data.shard_dir:
        folder = Path(cfg.data.shard_dir) / _folder_name(src)
        found = _meta_hash(folder)
        if found != _config_hash(src, cap):
            why = "no shards" if found is None else "shards of a different source config"
            raise ConfigError(
                "data.shard_dir", f"got {cfg.data.shard_dir!r}: {why} for source {src.name!r}; run prepare_shards again"
            )
        return _load(folder)
    folder = _cache_dir(src, cap, key)
    if _meta_hash(folder) is None:
        _build(src, key, cap, folder)
    return _load(folder)


def prepare_shards(cfg: Config, out_dir: str | Path) -> int:
    """Tokenize every source into out_dir/<name>, ready for `data.shard_dir=out_dir`."""
    for i, src in enumerate(cfg.data.sources):
        final, cap = Path(out_dir) / _folder_name(src), cfg.data.max_documents_per_source
        if _meta_hash(final) != _config_hash(src, cap):
            shutil.rmtree(final, ignore_errors=True)  # stale shards of an older config
            _build(src, f"data.sources.{i}", cap, final)
    return len(cfg.data.sources)
