"""The public path of the packed token stream (workloads/text/packing.py), for workloads of your
own that train on the project's corpus (docs/design.md 3)."""

from workloads.text.packing import (  # noqa: F401
    EVAL_SEED,
    Batch,
    PackedSource,
    TokenDataset,
    check_corpus,
    packing_efficiency,
    source_token_shares,
)
