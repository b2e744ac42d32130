"""Joint batch-size / learning-rate sweeps for language models on Ray Tune, Ray Train and DeepSpeed."""

__version__ = "0.1.0"
