"""What runs in each Ray Train worker: the loop, the DeepSpeed engine, checkpoints, the metrics
window, the noise-scale probe."""
