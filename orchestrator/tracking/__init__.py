"""The one door to MLflow: runs, tags, metrics and artifacts; the workers' batched metric logger."""
