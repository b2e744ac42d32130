"""workloads/text/corpus.py (tokenizer, sources, token cache) and workloads/text/packing.py (split, packing,
mixture, decomposition)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import threading
from collections import Counter
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import derived, schema
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config, SourceConfig
from orchestrator.formulas.batching import BatchPlan
from orchestrator.studies import kinds
from workloads.text import corpus as C
from workloads.text import mixture
from workloads.text import packing as D

FIELDS = ("inputs", "targets", "positions", "doc_ids", "loss_mask", "source_ids", "origins")


@pytest.fixture(autouse=True, scope="module")
def shared_cache(tmp_path_factory):
    """One token cache for the module: caches are keyed by source config, so sharing is safe."""
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("token-cache")
        mp.setenv("ORCHESTRATOR_CACHE_DIR", str(path))
        yield path


def make_cfg(
    *sources: SourceConfig, seq_len: int = 16, max_docs: int = 300, seed: int = 0, eval_fraction: float = 0.1
) -> Config:
    cfg = Config()
    cfg.data.seq_len, cfg.data.max_documents_per_source, cfg.data.eval_fraction = seq_len, max_docs, eval_fraction
    cfg.train.seed = seed
    if sources:
        cfg.data.sources = list(sources)
    return cfg


def files_source(path: Path | str, **kw) -> SourceConfig:
    return SourceConfig(name="user", kind="files", path=str(path), **kw)


def same(a: D.Batch, b: D.Batch) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def cat(batches: list[D.Batch]) -> D.Batch:
    return D.Batch(**{f: torch.cat([getattr(b, f) for b in batches]) for f in FIELDS})


def doc_bytes(data: C.SourceTokens, i: int) -> bytes:
    return data.document(i).astype(np.uint8).tobytes()


# ---------------------------------------------------------------- tokenizer and sources


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text())
def test_encode_decode_round_trip_and_eos(a: str, b: str):
    tokens = C.encode(a)
    assert tokens.dtype == np.uint16 and (tokens < 256).all()  # text never yields EOS
    assert C.decode(tokens) == a
    joined = np.concatenate([tokens, [C.EOS], C.encode(b), [C.EOS]])
    assert C.decode(joined) == a + b
    assert C.decode(torch.as_tensor(joined.astype(np.int64))) == a + b


def test_decode_rejects_ids_outside_the_vocabulary():
    with pytest.raises(ValueError):
        C.decode([C.VOCAB_SIZE])


def test_builtin_sources_are_bounded_deterministic_and_correct():
    code = list(islice(C.iter_documents(SourceConfig(name="c", kind="code")), 400))
    prose = list(C.iter_documents(SourceConfig(name="p", kind="prose")))
    arith = list(C.iter_documents(SourceConfig(name="a", kind="arithmetic")))
    assert max(map(len, code)) <= C.CODE_DOC_BYTES and all(code)
    assert 200 <= len(prose) and max(map(len, prose)) <= C.PROSE_DOC_BYTES
    assert len(arith) == C.ARITHMETIC_DOCS and arith == list(
        C.iter_documents(SourceConfig(name="b", kind="arithmetic"))
    )
    for line in b"".join(arith[:50]).decode().splitlines():
        a, op, b, c = re.fullmatch(r"(\d+)([+*-])(\d+)=(-?\d+)", line).groups()
        assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] == int(c)


def test_code_chunks_reassemble_the_files():
    """Chunking happens at line boundaries and loses nothing: big files come back whole."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    big = root / "typing.py"  # > 16 KiB in every supported Python
    docs = list(C._pack_pieces(big.read_bytes().splitlines(keepends=True), C.CODE_DOC_BYTES))
    assert len(docs) > 1 and b"".join(docs) == big.read_bytes()
    assert all(d.endswith(b"\n") for d in docs[:-1])


def test_files_source_reads_txt_jsonl_and_parquet(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "txt" / "sub").mkdir(parents=True)
    (tmp_path / "txt" / "a.txt").write_text("first doc\n")
    (tmp_path / "txt" / "sub" / "b.txt").write_text("second doc, héllo\n")
    (tmp_path / "txt" / "empty.txt").write_text("")
    (tmp_path / "txt" / "notes.md").write_text("ignored")
    rows = [{"text": "one", "id": 1}, {"text": "two ✓", "id": 2}, {"body": "x", "text": "three"}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    pq.write_table(pa.table({"content": ["p0", None, "p2", "p3", "p4"]}), tmp_path / "d.parquet", row_group_size=2)

    assert [d.decode() for d in C.iter_documents(files_source(tmp_path / "txt"))] == [
        "first doc\n",
        "second doc, héllo\n",
    ]
    assert [d.decode() for d in C.iter_documents(files_source(tmp_path / "c.jsonl"))] == ["one", "two ✓", "three"]
    assert [d.decode() for d in C.iter_documents(files_source(tmp_path / "d.parquet", text_field="content"))] == [
        "p0",
        "p2",
        "p3",
        "p4",
    ]
    assert len(list(C.iter_documents(files_source(tmp_path / "**" / "*.txt")))) == 2

    cfg = make_cfg(files_source(tmp_path / "c.jsonl"))
    data = C.load_source(cfg, 0)
    assert [C.decode(data.document(i)) for i in range(data.num_documents)] == ["one", "two ✓", "three"]
    cfg.data.max_documents_per_source = 2
    assert C.load_source(cfg, 0).num_documents == 2


def test_files_source_errors_name_the_key(tmp_path: Path):
    (tmp_path / "c.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ConfigError, match=r"data\.sources\.0\.text_field.*'text'"):
        list(C.iter_documents(files_source(tmp_path / "c.jsonl")))
    with pytest.raises(ConfigError, match=r"data\.sources\.0\.path.*nope"):
        C.resolve_files(files_source(tmp_path / "nope"), "data.sources.0")
    with pytest.raises(ConfigError, match=r"data\.sources\.0\.path"):
        C.resolve_files(files_source(tmp_path / "*.txt"), "data.sources.0")


# ---------------------------------------------------------------- packing


def check_window_invariants(batch: D.Batch, S: int) -> None:
    x, y, pos, doc, mask = batch.inputs, batch.targets, batch.positions, batch.doc_ids, batch.loss_mask
    assert x.shape == y.shape == pos.shape == doc.shape == mask.shape == (len(batch.source_ids), S)
    assert x.dtype == y.dtype == pos.dtype == doc.dtype == torch.int64 and mask.dtype == torch.float32
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert (doc[:, 0] == 0).all() and (pos[:, 0] == 0).all()
    step = doc[:, 1:] - doc[:, :-1]
    assert ((step == 0) | (step == 1)).all()
    boundary = step == 1
    assert torch.equal(pos[:, 1:] == 0, boundary)  # positions restart exactly where a document starts
    assert (pos[:, 1:][~boundary] == pos[:, :-1][~boundary] + 1).all()
    assert torch.equal(mask[:, :-1] == 0, boundary)  # the EOS -> next document position is not loss-bearing
    assert torch.equal(mask == 0, x == C.EOS)


@pytest.mark.parametrize("seq_len", [7, 16])
def test_windows_match_a_brute_force_stream(seq_len: int):
    cfg = make_cfg(seq_len=seq_len, max_docs=40)
    ds = D.TokenDataset(cfg)
    for i, packed in enumerate(ds.sources):
        data = C.load_source(cfg, i)
        stream, doc_of, pos_in = [], [], []
        for n, d in enumerate(packed.doc_order):
            toks = list(data.document(d)) + [C.EOS]
            stream += toks
            doc_of += [n] * len(toks)
            pos_in += range(len(toks))
        S = seq_len
        assert packed.num_sequences == (len(stream) - 1) // S
        js = list(range(packed.num_sequences))
        batch = ds.sequence_batch(i, js)
        check_window_invariants(batch, S)
        for j in js:
            w = slice(j * S, j * S + S)
            assert batch.inputs[j].tolist() == stream[w]
            assert batch.targets[j].tolist() == stream[j * S + 1 : j * S + S + 1]
            assert batch.doc_ids[j].tolist() == [doc_of[p] - doc_of[j * S] for p in range(w.start, w.stop)]
            expected_pos = [p - w.start if doc_of[p] == doc_of[w.start] else pos_in[p] for p in range(w.start, w.stop)]
            assert batch.positions[j].tolist() == expected_pos
            assert batch.loss_mask[j].tolist() == [float(doc_of[p] == doc_of[p + 1]) for p in range(w.start, w.stop)]


@pytest.mark.parametrize("seq_len, expected", [(4, 3), (5, 3), (15, 1), (16, 0)])
def test_a_window_needs_seq_len_plus_one_tokens(tmp_path: Path, seq_len: int, expected: int):
    (tmp_path / "a.txt").write_text("abcdefghijklmno")  # 15 bytes + EOS = 16 tokens in the stream
    ds = D.TokenDataset(make_cfg(files_source(tmp_path), seq_len=seq_len, eval_fraction=1e-9))
    assert ds.sources[0].num_sequences == expected
    if expected:
        last = ds.sequence_batch(0, [expected - 1])
        assert last.targets[0, -1].item() == (
            C.EOS if 15 % seq_len == 0 else ord("abcdefghijklmno"[expected * seq_len])
        )
    else:
        with pytest.raises(ConfigError, match=r"data\.sources\.0: .*fewer than one sequence"):
            ds.update_batch(0, 1)


def test_windows_hold_whole_train_documents_in_some_order():
    """Order-free check: split the concatenated windows at EOS and find the train documents."""
    cfg = make_cfg(seq_len=16, max_docs=60)
    ds, ev = D.TokenDataset(cfg), D.TokenDataset(cfg, "eval")
    for i, packed in enumerate(ds.sources):
        data = C.load_source(cfg, i)
        stream = ds.sequence_batch(i, range(packed.num_sequences)).inputs.reshape(-1).tolist()
        complete, current = [], []
        for t in stream:
            if t == C.EOS:
                complete.append(bytes(current))
                current = []
            else:
                current.append(t)
        train_docs = Counter(
            doc_bytes(data, d) for d in set(range(data.num_documents)) - set(ev.sources[i].doc_order.tolist())
        )
        assert not Counter(complete) - train_docs  # every complete document is a train document
        assert sum(train_docs.values()) - len(complete) <= 1  # only the tail may be cut off


def test_train_and_eval_documents_are_disjoint_and_eval_is_not_empty():
    cfg = Config()
    train, ev = D.TokenDataset(cfg), D.TokenDataset(cfg, "eval")
    for i, (tr, he) in enumerate(zip(train.sources, ev.sources)):
        data = C.load_source(cfg, i)
        assert len(he.doc_order) > 0 and he.num_sequences > 0
        assert sorted(np.concatenate([tr.doc_order, he.doc_order]).tolist()) == list(range(data.num_documents))
        train_hashes = {hashlib.sha256(doc_bytes(data, d)).digest() for d in tr.doc_order}
        eval_hashes = {hashlib.sha256(doc_bytes(data, d)).digest() for d in he.doc_order}
        assert not train_hashes & eval_hashes
        share = len(he.doc_order) / data.num_documents
        assert abs(share - cfg.data.eval_fraction) < 4 * np.sqrt(0.05 * 0.95 / data.num_documents) + 0.01


# ---------------------------------------------------------------- mixture and determinism


def test_default_mixture_holds_each_source_within_one_sequence_in_every_update():
    cfg = Config()
    ds = D.TokenDataset(cfg)
    weights = np.array([src.weight for src in cfg.data.sources])
    for u in (0, 1, 7):
        batch = ds.update_batch(u, 64)
        check_window_invariants(batch, cfg.data.seq_len)
        counts = np.bincount(batch.source_ids.numpy(), minlength=3)
        # update u is the stretch [64u, 64(u+1)) of a stream whose every prefix is within one
        # sequence of its weights, so the stretch is within two
        assert np.abs(counts - 64 * weights).max() < 2
        real_share = D.source_token_shares(batch, ds.names)
        assert max(abs(real_share[src.name] - src.weight) for src in cfg.data.sources) < 0.06


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.001, 100.0, allow_subnormal=False), min_size=1, max_size=6), st.integers(0, 10**9))
def test_every_prefix_holds_every_source_within_one_sequence(weights: list[float], start: int):
    p = mixture.shares(weights)
    q = sum(p)
    target = np.asarray(p, np.float64) / q
    # exact for decimal weights; else rounded to 1/MAX_PERIOD, a tiny source keeping one position
    assert np.abs(target - np.asarray(weights) / sum(weights)).max() <= len(weights) / mixture.MAX_PERIOD
    n = min(3 * q, 5000)
    sources, counters = mixture.assign(weights, np.arange(n))
    counts = np.cumsum(np.eye(len(p), dtype=np.int64)[sources], axis=0)
    assert np.abs(counts - np.arange(1, n + 1)[:, None] * target).max() < 1
    # the counter is the source's own running count: each source's sequences in order, none twice
    assert (counters == counts[np.arange(n), sources] - 1).all()
    # any stretch of the stream, however far, is computed without history and agrees with the
    # prefix counts of the period
    far_sources, far_counters = mixture.assign(weights, np.arange(start, start + 50))
    cycle, offset = divmod(start, q)
    assert far_counters[0] == cycle * p[far_sources[0]] + (mixture.assign(weights, [offset])[1][0])


def test_weights_that_are_decimals_are_kept_exactly():
    assert mixture.shares([0.45, 0.45, 0.10]) == (9, 9, 2)
    assert mixture.shares([3, 1]) == (3, 1)
    assert mixture.shares([1 / 3, 1 / 3, 1 / 3]) == (1, 1, 1) or sum(mixture.shares([1 / 3] * 3)) == mixture.MAX_PERIOD
    with pytest.raises(ValueError):
        mixture.shares([1.0, 0.0])


def test_the_stream_keeps_configured_weights_exactly():
    """Weights 7 and 2 are a period of 9: 900,000 positions hold exactly 700,000 and 200,000 (the
    normalised floats 0.777...8 and 0.222...2 would be rounded to 1/65,536 instead)."""
    cfg = make_cfg(
        SourceConfig(name="a", kind="arithmetic", weight=7.0), SourceConfig(name="b", kind="prose", weight=2.0)
    )
    sources, _ = D.TokenDataset(cfg).stream_slots(0, 900_000)
    assert np.bincount(sources).tolist() == [700_000, 200_000]


def test_stream_counters_cover_each_epoch_once():
    cfg = make_cfg(seq_len=16, max_docs=30)
    ds = D.TokenDataset(cfg)
    sources, counters = ds.stream_slots(0, 400)
    for s, packed in enumerate(ds.sources):
        assert counters[sources == s].tolist() == list(range(int((sources == s).sum())))  # in order, no gap, no repeat
        first_epoch = packed.sequence_index(np.arange(packed.num_sequences))
        assert sorted(first_epoch.tolist()) == list(range(packed.num_sequences))
        second = packed.sequence_index(np.arange(packed.num_sequences, 2 * packed.num_sequences))
        assert sorted(second.tolist()) == sorted(first_epoch.tolist()) and not np.array_equal(second, first_epoch)
    fresh = D.TokenDataset(cfg)  # no history: update 33 is computed, not replayed
    assert same(fresh.update_batch(33, 10), ds.update_batch(33, 10))
    assert same(fresh.update_batch(33, 10), cat([ds.update_batch(66, 5), ds.update_batch(67, 5)]))
    check_window_invariants(fresh.update_batch(10**6, 10), 16)  # many epochs later


def test_same_seed_same_batches_other_seed_or_update_differs():
    a, b = D.TokenDataset(make_cfg(seed=3)), D.TokenDataset(make_cfg(seed=3))
    c = D.TokenDataset(make_cfg(seed=4))
    assert same(a.update_batch(2, 12), b.update_batch(2, 12))
    assert not torch.equal(a.update_batch(2, 12).inputs, c.update_batch(2, 12).inputs)
    assert not torch.equal(a.update_batch(2, 12).inputs, a.update_batch(3, 12).inputs)


SPLITS_4 = [(4, 1, 1), (2, 1, 2), (1, 1, 4), (2, 2, 1), (1, 2, 2)]
SPLITS_16 = [(16, 1, 1), (4, 2, 2), (2, 4, 2), (1, 2, 8), (8, 2, 1), (1, 16, 1)]


@pytest.mark.parametrize("splits", [SPLITS_4, SPLITS_16])
def test_every_split_sees_the_same_sequences_in_the_same_slots(splits):
    S = 8
    ds = D.TokenDataset(make_cfg(seq_len=S))
    n = splits[0][0] * splits[0][1] * splits[0][2]
    for u in range(3):
        full = ds.update_batch(u, n)
        for b, d, a in splits:
            plan = BatchPlan(S, b, d, a)
            assert plan.tokens_per_update == n * S
            parts = [ds.micro_batch(u * n, plan, rank, step) for step in range(a) for rank in range(d)]
            assert same(cat(parts), full)
            rows = sorted(map(tuple, torch.cat([p.inputs for p in parts]).tolist()))
            assert rows == sorted(map(tuple, full.inputs.tolist()))


def test_micro_batch_builds_only_its_own_sequences(monkeypatch):
    ds = D.TokenDataset(make_cfg(seq_len=8))
    built = []
    original = D.PackedSource.windows
    monkeypatch.setattr(D.PackedSource, "windows", lambda self, seqs: built.append(len(seqs)) or original(self, seqs))
    ds.micro_batch(5, BatchPlan(8, 2, 4, 8), rank=3, accum_step=6)
    assert sum(built) == 2
    with pytest.raises(ValueError):
        ds.micro_batch(0, BatchPlan(8, 2, 4, 8), rank=4, accum_step=0)


def test_micro_batches_differ_in_real_tokens():
    cfg = Config()
    ds = D.TokenDataset(cfg)
    plan = BatchPlan(cfg.data.seq_len, 8, 1, cfg.batch.tokens_per_update // (8 * cfg.data.seq_len))
    for u in range(3):
        first = u * plan.sequences_per_update
        real = [ds.micro_batch(first, plan, 0, a).real_tokens for a in range(plan.grad_accum_steps)]
        assert len(set(real)) >= 2 and sum(real) == ds.update_batch(u, plan.sequences_per_update).real_tokens
    assert 0.9 < D.packing_efficiency(ds.update_batch(0, 32)) < 1.0


def test_eval_set_is_the_same_for_every_seed_micro_batch_and_worker_count():
    whole = cat(D.TokenDataset(make_cfg(seed=0), "eval").eval_batches(40 * 16, 40))
    assert len(whole.inputs) == 40
    check_window_invariants(whole, 16)
    other_seed = cat(D.TokenDataset(make_cfg(seed=9), "eval").eval_batches(40 * 16, 40))
    assert same(whole, other_seed)
    ds = D.TokenDataset(make_cfg(), "eval")
    for b, world in [(6, 1), (4, 3), (7, 2), (1, 4), (40, 3)]:
        shares = [ds.eval_batches(40 * 16, b, rank, world) for rank in range(world)]
        assert len({len(s) for s in shares}) == 1, "every rank runs the same number of forwards"
        real = [batch for share in shares for batch in share if batch.real_tokens]
        rows = sorted(map(tuple, torch.cat([x.inputs for x in real]).tolist()))
        assert rows == sorted(map(tuple, whole.inputs.tolist())), (b, world)  # each sequence once, none dropped
        assert sum(x.real_tokens for x in real) == whole.real_tokens
    counts = np.bincount(whole.source_ids.numpy(), minlength=3)
    assert np.abs(counts - 40 * np.array([0.45, 0.45, 0.10])).max() < 1
    with pytest.raises(ValueError):
        D.TokenDataset(make_cfg()).eval_batches(64, 4)


# ---------------------------------------------------------------- cache, shards and corpus checks


def test_concurrent_builders_share_one_complete_cache(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("ORCHESTRATOR_CACHE_DIR", str(tmp_path))
    cfg = make_cfg(SourceConfig(name="arith", kind="arithmetic"), max_docs=500)
    results = [None] * 6

    def build(k: int) -> None:
        results[k] = C.load_source(cfg, 0)

    threads = [threading.Thread(target=build, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(os.listdir(tmp_path)) == 1  # one final folder, no temp folders left behind
    assert all(
        np.array_equal(r.tokens, results[0].tokens) and np.array_equal(r.offsets, results[0].offsets) for r in results
    )
    assert results[0].num_documents == 500 and isinstance(results[0].tokens, np.memmap)


def test_prepared_shards_give_identical_batches(tmp_path: Path, monkeypatch):
    cfg = make_cfg(seq_len=16, max_docs=50)
    before = D.TokenDataset(cfg).update_batch(4, 16)
    assert C.prepare_shards(cfg, tmp_path / "shards") == 3
    assert sorted(os.listdir(tmp_path / "shards")) == ["arithmetic", "code", "prose"]
    monkeypatch.setenv("ORCHESTRATOR_CACHE_DIR", str(tmp_path / "unused-cache"))
    cfg.data.shard_dir = str(tmp_path / "shards")
    assert same(D.TokenDataset(cfg).update_batch(4, 16), before)
    assert not (tmp_path / "unused-cache").exists()
    cfg.data.max_documents_per_source = 51  # shards no longer match the config
    with pytest.raises(ConfigError, match=r"data\.shard_dir"):
        D.TokenDataset(cfg)


def test_check_corpus_passes_and_fails_with_one_clear_line(tmp_path: Path):
    D.check_corpus(make_cfg(), tokens_per_update=64 * 16)
    with pytest.raises(ConfigError, match=r"^data\.sources\.0\.path: got '.*missing'") as err:
        D.check_corpus(make_cfg(files_source(tmp_path / "missing")), 64)
    assert err.value.key == "data.sources.0.path" and "\n" not in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"data\.sources\.0\.path"):
        D.check_corpus(make_cfg(files_source(tmp_path / "empty")), 64)
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.txt").write_text("")
    with pytest.raises(ConfigError, match=r"data\.sources\.0\.path.*no documents"):
        D.check_corpus(make_cfg(files_source(tmp_path / "blank")), 64)
    (tmp_path / "small").mkdir()
    for k in range(40):
        (tmp_path / "small" / f"{k}.txt").write_text(f"document number {k}, a little text\n")
    cfg = make_cfg(files_source(tmp_path / "small"), eval_fraction=0.2)
    train_tokens = D.TokenDataset(cfg).sources[0].num_tokens
    D.check_corpus(cfg, tokens_per_update=train_tokens)
    with pytest.raises(ConfigError, match=rf"holds {train_tokens:,} tokens; one update needs {train_tokens + 1:,}"):
        D.check_corpus(cfg, tokens_per_update=train_tokens + 1)
    tiny = make_cfg(
        files_source(tmp_path / "small"), SourceConfig(name="arith", kind="arithmetic"), seq_len=256, eval_fraction=0.2
    )
    tiny.data.max_documents_per_source = 2
    with pytest.raises(ConfigError, match=r"data\.sources\.\d: source .* fewer than one sequence"):
        D.check_corpus(tiny, tokens_per_update=256)


# ---------------------------------------------------------------- one stream for every batch size (docs/design.md 4.5)

DEMO_SWEEP = Path(__file__).resolve().parents[2] / "conf" / "sweep" / "demo.yaml"


def demo_trials():

    sweep = kinds.load(DEMO_SWEEP)
    trials = kinds.expand(sweep)
    by_batch = {t.cfg.batch.tokens_per_update: t.cfg for t in trials}
    return [by_batch[b] for b in sorted(by_batch)]


def consumed(cfg: Config, tokens: int) -> D.Batch:
    """Every sequence a run of `cfg` trains on in its first `tokens` tokens, in the order the
    updates, accumulation steps and ranks consume them."""
    from orchestrator.core.derived import batch_plan

    plan, ds = batch_plan(cfg), D.TokenDataset(cfg)
    parts = [
        ds.micro_batch(u * plan.sequences_per_update, plan, rank, a)
        for u in range(tokens // plan.tokens_per_update)
        for a in range(plan.grad_accum_steps)
        for rank in range(plan.num_workers)
    ]
    return cat(parts)


def test_every_batch_size_of_the_demo_trains_on_the_same_stream():
    trials = demo_trials()
    assert len(trials) == 4  # 256 to 2,048 tokens per update
    largest = max(t.batch.tokens_per_update for t in trials)
    tokens = 4 * largest
    reference = consumed(trials[0], tokens)
    for cfg in trials[1:]:
        other = consumed(cfg, tokens)
        # the same tokens, sources and (document, offset) origins in the same order
        assert same(other, reference), (
            f"B={cfg.batch.tokens_per_update} sees other sequences than B={trials[0].batch.tokens_per_update}"
        )
    # (source, document, offset) of each sequence is what the token windows say it is
    S = trials[0].data.seq_len
    for row in range(0, len(reference.inputs), 37):
        source, (doc, offset) = int(reference.source_ids[row]), reference.origins[row].tolist()
        document = np.append(C.load_source(trials[0], source).document(doc), C.EOS)
        n = min(S, len(document) - offset)
        assert reference.inputs[row, :n].tolist() == document[offset : offset + n].tolist()


def ramped(cfg: Config) -> Config:
    """cfg on 2 workers with a batch.ramp of two changes: 256 -> 512 at 2,048 tokens -> 1,024 at 6,144."""
    out = copy.deepcopy(cfg)
    out.cluster.num_workers = 2
    out.batch.ramp = [schema.RampStep(0, 256), schema.RampStep(2048, 512), schema.RampStep(6144, 1024)]
    return out


def consumed_along(cfg: Config, tokens: int) -> D.Batch:
    """What `consumed` gives, for a run whose split follows its segments (batch.ramp): each
    update read from the stream position of the tokens seen before it, as the trainer does."""
    ds, parts = D.TokenDataset(cfg), []
    for segment in derived.batch_segments(cfg):
        p = segment.plan
        for before in range(segment.start_tokens, min(segment.end_tokens, tokens), p.tokens_per_update):
            for a in range(p.grad_accum_steps):
                parts += [ds.micro_batch(before // p.seq_len, p, rank, a) for rank in range(p.num_workers)]
    return cat(parts)


def test_a_ramped_run_consumes_the_fixed_runs_stream_in_order():
    """Two changes of batch size (and of b, A, D against the fixed run): the same (source,
    document, offset) sequences in the same order as the fixed-batch run over the same tokens,
    and each source within one sequence of its share at every prefix of the whole budget."""
    fixed = demo_trials()[0]
    assert fixed.batch.tokens_per_update == 256
    ramp = ramped(fixed)
    segments = derived.batch_segments(ramp)
    assert [s.plan.tokens_per_update for s in segments] == [256, 512, 1024]
    tokens = 12 * 1024
    assert same(consumed_along(ramp, tokens), consumed(fixed, tokens))
    assert same(consumed_along(fixed, tokens), consumed(fixed, tokens)), "one segment: the fixed run itself"
    ids = consumed_along(ramp, ramp.train.total_tokens).source_ids.numpy()
    assert len(ids) == segments[-1].end_tokens // ramp.data.seq_len
    weights = np.array([s.weight for s in ramp.data.sources])
    counts = np.cumsum(np.eye(len(weights), dtype=np.int64)[ids], axis=0)
    expected = np.arange(1, len(ids) + 1)[:, None] * weights / weights.sum()
    assert np.abs(counts - expected).max() < 1


def test_every_prefix_of_the_stream_holds_each_source_at_its_weight():
    trials = demo_trials()
    weights = np.array([s.weight for s in trials[0].data.sources])
    weights = weights / weights.sum()
    for cfg in trials:
        # every run of the demo, over its whole budget: each source within one sequence of its
        # share at every prefix, so none is ever absent
        ids = consumed(cfg, cfg.train.total_tokens).source_ids.numpy()
        counts = np.cumsum(np.eye(len(weights), dtype=np.int64)[ids], axis=0)
        expected = np.arange(1, len(ids) + 1)[:, None] * weights
        assert np.abs(counts - expected).max() < 1, f"B={cfg.batch.tokens_per_update}"
        assert (counts[-1] > 0).all()


def test_the_token_cache_is_the_users_not_the_working_folders(monkeypatch, tmp_path):
    """A run in a new folder finds the corpus already tokenized: the caches live in the user's
    cache folder ($XDG_CACHE_HOME, else ~/.cache) unless ORCHESTRATOR_CACHE_DIR names another."""
    from workloads.text import corpus

    monkeypatch.delenv("ORCHESTRATOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    assert corpus.cache_root() == tmp_path / "xdg" / "orchestrator" / "tokens"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert corpus.cache_root() == tmp_path / "home" / ".cache" / "orchestrator" / "tokens"
    monkeypatch.setenv("ORCHESTRATOR_CACHE_DIR", str(tmp_path / "shared"))
    assert corpus.cache_root() == tmp_path / "shared"
