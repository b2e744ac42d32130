"""MLflow's own CPU / memory / GPU sampler, its samples sent through the run's batched logger."""

from __future__ import annotations

from orchestrator.tracking.metric_logger import MetricLogger


def start_system_metrics(logger: MetricLogger, interval_s: float):
    """MLflow's own CPU / memory / GPU sampler on `logger`'s run, its samples sent through
    `logger` (a MetricLogger): buffered while the store is away and replayed, each step once,
    like every other metric (MLflow's own sender drops them and stops). Call .finish() before
    closing the logger."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    class Buffered(SystemMetricsMonitor):
        def publish_metrics(self, metrics):
            logger.log({f"system/{k}": v for k, v in metrics.items()}, self._logging_step)
            self._logging_step += 1
            for monitor in self.monitors:
                monitor.clear_metrics()

    monitor = Buffered(logger.run_id, sampling_interval=interval_s, resume_logging=True, tracking_uri=logger.uri)
    monitor.start()
    return monitor
