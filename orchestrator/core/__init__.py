"""The core (pure: no Ray, DeepSpeed, MLflow or torch): the config's schema, reading, checks and
what it implies; the sweep file's; errors; storage locations; the DeepSpeed config."""
