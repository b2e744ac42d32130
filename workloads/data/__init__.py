"""The data a worker trains on: tokenizers, the corpus and its token cache, the mixture of
sources, the packed stream of sequences. `workloads.data` is a public path: its names are the
packing module's (docs/design.md 3)."""

from workloads.data.packing import (  # noqa: F401
    EVAL_SEED,
    Batch,
    PackedSource,
    TokenDataset,
    check_corpus,
    packing_efficiency,
    source_token_shares,
)
