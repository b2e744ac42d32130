"""The corpus: sources -> documents -> tokens, cached memory-mapped on disk.

Built-in sources need no download (the standard library's source as `code`, the reference
documentation of `pydoc_data` as `prose`, generated `arithmetic`); user sources are .txt,
.jsonl or .parquet files, or a Hugging Face `datasets` dataset on local disk, all streamed.
Every source is tokenized once (workloads/text/tokenizer.py: bytes or a tokenizer.json) into a
memory-mapped token file plus document offsets, so training never holds a corpus in RAM;
`prepare_shards` writes the same files for reuse. Packing and batching are in `workloads/text/packing.py`.
"""

from __future__ import annotations

import contextlib
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

from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config, SourceConfig
from workloads.text import tokenizer as tokenizers
from workloads.text.tokenizer import Tokenizer

EOS = 256  # of the byte tokenizer
VOCAB_SIZE = 257
ENCODE_CHUNK = 256  # documents per encode_batch call
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


def _hf_files(path: Path) -> List[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def _open_hf(src: SourceConfig, key: str):
    """The split of a local `datasets` dataset: one `save_to_disk` wrote (memory-mapped Arrow), or
    a folder of parquet, json(l) or text files (streamed). Never a download."""
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{key}.kind", "got 'hf'; it needs the hf extra: pip install -e '.[hf]'") from None
    path = Path(src.path or "")
    if not path.is_dir():
        raise ConfigError(
            f"{key}.path",
            f"got {src.path!r}; not a local folder (nothing is downloaded at run time: save the dataset with "
            "`save_to_disk`, or point at a folder of parquet, json or text files)",
        )
    if any((path / f).exists() for f in ("dataset_dict.json", "dataset_info.json", "state.json")):
        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            if src.split not in data:
                raise ConfigError(f"{key}.split", f"got {src.split!r}; the dataset has {', '.join(data)}")
            data = data[src.split]
        return data
    builders = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".txt": "text"}
    files = [p for p in _hf_files(path) if p.suffix in builders]
    kinds = {builders[p.suffix] for p in files}
    if len(kinds) != 1:
        raise ConfigError(
            f"{key}.path", f"got {src.path!r}; want a save_to_disk folder or files of one kind (parquet, json or text)"
        )
    (kind,) = kinds
    files_ = {src.split: [str(p) for p in files]}
    return datasets.load_dataset(kind, data_files=files_, split=src.split, streaming=True)


def _hf_documents(src: SourceConfig, key: str) -> Iterator[bytes]:
    data = _open_hf(src, key)
    columns = data.column_names
    if columns is not None and src.text_field not in columns:
        raise ConfigError(f"{key}.text_field", f"got {src.text_field!r}; the dataset's columns: {', '.join(columns)}")
    for row in data.select_columns([src.text_field]) if columns is not None else data:
        text = row.get(src.text_field)
        if not isinstance(text, str) and text is not None:
            raise ConfigError(f"{key}.text_field", f"got {src.text_field!r}; it holds {type(text).__name__}, not text")
        yield (text or "").encode("utf-8")


def iter_documents(src: SourceConfig, key: str = "data.sources.0") -> Iterator[bytes]:
    """Every non-empty document of a source in a fixed order (an empty one would be a bare EOS)."""
    builtin = {"code": _code_documents, "prose": _prose_documents, "arithmetic": _arithmetic_documents}
    if src.kind in builtin:
        documents = builtin[src.kind]()
    else:
        documents = (_hf_documents if src.kind == "hf" else _files_documents)(src, key)
    return (d for d in documents if d)


# ---------------------------------------------------------------- token cache and shards


@dataclass
class SourceTokens:
    """One tokenized source: a uint16 memmap of all tokens and int64 document offsets."""

    tokens: np.ndarray
    offsets: np.ndarray
    """num_documents + 1 offsets into `tokens`."""
    canonical: np.ndarray
    """Per document, the index of its first exact copy (itself if unique): the split key."""
    eos: int = EOS
    """The tokenizer's end-of-document id, which packing puts after every document."""

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    def document(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[self.offsets[i] : self.offsets[i + 1]])


def hash64(data: bytes | str) -> int:
    return int.from_bytes(
        hashlib.blake2b(data.encode() if isinstance(data, str) else data, digest_size=8).digest(), "little"
    )


def heldout_mask(name: str, doc_keys: np.ndarray, fraction: float) -> np.ndarray:
    """True for held-out documents: splitmix64(hash(name) ^ index) / 2^64 < fraction.

    Keyed by document index, where exact copies share their first copy's index: a document can
    never sit in train and eval at once. Vectorised: a million documents cost milliseconds.
    """
    x = np.asarray(doc_keys, dtype=np.uint64) ^ np.uint64(hash64(name))
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / 2.0**53 < fraction


def _short_hash(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def _config_hash(src: SourceConfig, cap: int, tok: Tokenizer) -> str:
    """What the tokens depend on (not the source's name or weight); shards are checked against it."""
    return _short_hash([src.kind, src.path, src.text_field, src.split if src.kind == "hf" else None, cap, tok.key])


def _folder_name(src: SourceConfig) -> str:
    return re.sub(r"[^\w.-]", "_", src.name)


def _cache_dir(src: SourceConfig, cap: int, key: str, tok: Tokenizer) -> Path:
    """The cache key adds what the inputs are today (Python version, file sizes and mtimes)."""
    if src.kind in ("files", "hf"):
        files = resolve_files(src, key) if src.kind == "files" else _hf_files(Path(src.path or ""))
        inputs = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    else:
        inputs = [sys.version, sysconfig.get_paths()["stdlib"]]
    return cache_root() / f"{_folder_name(src)}-{_short_hash([_config_hash(src, cap, tok), inputs])}"


def cache_root() -> Path:
    """Where the token caches live: ORCHESTRATOR_CACHE_DIR, else the user's cache folder
    ($XDG_CACHE_HOME, else ~/.cache) / orchestrator / tokens, so a run in a new folder does not
    tokenize the corpus again. Sharing is safe: a cache's folder name is the hash of everything
    its tokens depend on (the source, its files' sizes and times, the tokenizer, the cap)."""
    given = os.environ.get("ORCHESTRATOR_CACHE_DIR")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orchestrator" / "tokens"


def _meta_hash(folder: Path) -> Optional[str]:
    meta = folder / "meta.json"
    return json.loads(meta.read_text())["config_hash"] if meta.exists() else None


def _build(src: SourceConfig, key: str, cap: int, final: Path, tok: Tokenizer) -> None:
    """Tokenize into a private temp folder, then rename it into place.

    Several workers may build the same cache at once: the first rename wins and the others
    drop their copy, so a reader only ever sees a complete folder (meta.json is written last).
    """
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        offsets, digests, docs = array("q", [0]), array("Q"), iter_documents(src, key)
        docs = islice(docs, cap) if cap else docs
        with open(tmp / "tokens.bin", "wb") as f:
            while chunk := list(islice(docs, ENCODE_CHUNK)):
                for doc, ids in zip(chunk, tok.encode_batch(chunk)):
                    f.write(ids.astype(tok.dtype).tobytes())
                    offsets.append(offsets[-1] + len(ids))
                    digests.append(hash64(doc))
        _, first, inverse = np.unique(np.asarray(digests, np.uint64), return_index=True, return_inverse=True)
        np.save(tmp / "offsets.npy", np.asarray(offsets, np.int64))
        np.save(tmp / "canonical.npy", first[inverse.reshape(-1)].astype(np.int64))
        meta = {"name": src.name, "config_hash": _config_hash(src, cap, tok), "dtype": np.dtype(tok.dtype).name}
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            os.rename(tmp, final)
        except OSError:
            if _meta_hash(final) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load(folder: Path, tok: Tokenizer) -> SourceTokens:
    offsets = np.load(folder / "offsets.npy")
    n = int(offsets[-1])
    dtype = np.dtype(json.loads((folder / "meta.json").read_text()).get("dtype", "uint16"))
    tokens = np.memmap(folder / "tokens.bin", dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
    return SourceTokens(tokens, offsets, np.load(folder / "canonical.npy"), tok.eos_id)


def load_source(cfg: Config, index: int) -> SourceTokens:
    """Source `index`'s tokens: from data.shard_dir if set, else the cache (built on first use)."""
    src, cap, key = cfg.data.sources[index], cfg.data.max_documents_per_source, f"data.sources.{index}"
    tok = tokenizers.load(cfg.data.tokenizer)
    if cfg.data.shard_dir:
        folder = Path(cfg.data.shard_dir) / _folder_name(src)
        found = _meta_hash(folder)
        if found != _config_hash(src, cap, tok):
            why = "no shards" if found is None else "shards of a different source config or tokenizer"
            raise ConfigError(
                "data.shard_dir",
                f"got {cfg.data.shard_dir!r}: {why} for source {src.name!r}; run `orchestrator prepare` again",
            )
        return _load(folder, tok)
    folder = _cache_dir(src, cap, key, tok)
    if _meta_hash(folder) is None:
        _build(src, key, cap, folder, tok)
    return _load(folder, tok)


def prepare_shards(cfg: Config, out_dir: str | Path) -> int:
    """Tokenize every source into out_dir/<name>, ready for `data.shard_dir=out_dir`.

    Only what prepare wrote is ever replaced: `out_dir` must be new, empty, or hold nothing but
    shard folders of its own (each has a meta.json, written last); anything else is refused
    before a byte is written. A failure leaves no folder it created."""
    out = Path(out_dir)
    check_prepare_folder(out)
    tok = tokenizers.load(cfg.data.tokenizer)
    with removed_on_failure(out):
        for i, src in enumerate(cfg.data.sources):
            final, cap = out / _folder_name(src), cfg.data.max_documents_per_source
            if _meta_hash(final) != _config_hash(src, cap, tok):
                if final.exists():
                    shutil.rmtree(final)  # stale shards of an older config: prepare's own (checked above)
                _build(src, f"data.sources.{i}", cap, final, tok)
    return len(cfg.data.sources)


@contextlib.contextmanager
def removed_on_failure(out: Path) -> Iterator[None]:
    """If the block fails, remove the folders it created on the way to `out`: the outermost one
    missing now, with all below it (`--out a/b/c` where only `a` exists: `a/b`)."""
    missing = next((folder for folder in reversed([out, *out.parents]) if not folder.exists()), None)
    try:
        yield
    except BaseException:
        if missing is not None:
            shutil.rmtree(missing, ignore_errors=True)
        raise


def check_prepare_folder(out: Path) -> None:
    """ConfigError unless `out` is new, empty, or holds only what prepare writes: shard folders
    (each with its meta.json) and the tokenizer `prepare --train-tokenizer` trains."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError("--out", f"{out} is a file; give a new folder or one prepare wrote")
    for entry in sorted(out.iterdir()):
        ours = entry.is_dir() and not entry.is_symlink() and (entry / "meta.json").is_file()
        if not ours and not (entry.name == tokenizers.TRAINED_FILE and entry.is_file()):
            raise ConfigError(
                "--out", f"{entry} is not a shard folder prepare wrote (no meta.json); give a new or empty folder"
            )


def training_texts(cfg: Config) -> Iterator[str]:
    """The documents of every source's training split (what a tokenizer may learn from: never the
    held-out ones), as text."""

    for i, src in enumerate(cfg.data.sources):
        cap, seen = cfg.data.max_documents_per_source, {}
        docs = iter_documents(src, f"data.sources.{i}")
        for index, doc in enumerate(islice(docs, cap) if cap else docs):
            first = seen.setdefault(hash64(doc), index)  # copies split with their first copy
            if not heldout_mask(src.name, np.asarray([first]), cfg.data.eval_fraction)[0]:
                yield doc.decode("utf-8", errors="replace")
