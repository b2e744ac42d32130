"""The text a worker trains on: tokenizers, the corpus and its token cache, the mixture of
sources, the packed stream of sequences (packing, public as `workloads.data`)."""
