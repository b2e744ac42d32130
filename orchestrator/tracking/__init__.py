"""The one door to MLflow: a Store (store.py) that creates, writes and reads runs and answers in the
project's records (records.py), the tags it names (run_tags.py), the workers' batched metric logger
(metric_logger.py) and system-metrics sampler, the UI and its links (mlflow_ui.py), and the view
comparing a sweep's trials there (compare_view.py)."""
