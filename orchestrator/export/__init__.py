"""A run's checkpoint -> model.safetensors: find the run, fetch its checkpoint, consolidate the
ZeRO shards, write. `orchestrator.export.load_state_dict` is a public path (docs/design.md 3)."""

from orchestrator.export.export import load_state_dict  # noqa: F401
