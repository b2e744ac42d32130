"""Peak memory of a stretch of code on one device, as the growth of live tensor bytes.

CUDA: the caching allocator's statistics (max_memory_allocated over memory_allocated at the start).
CPU: torch's profiler records every allocation and free of a CPU tensor with its size; their
running sum is the live bytes, and its maximum the peak. (The process's resident set would say
more about glibc's heap than about the model: freed activations stay mapped.)

    with PeakMemory(device) as peak:
        one_update()
    peak.bytes
"""

from __future__ import annotations

import torch

MEMORY_EVENT = "[memory]"  # the profiler's name for an allocation (+bytes) or a free (-bytes)


class PeakMemory:
    def __init__(self, device: torch.device):
        self.device = device
        self.bytes = 0
        self._profiler = None
        self._start = 0

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            from torch.profiler import ProfilerActivity, profile

            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profiler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self._start
            return
        self._profiler.__exit__(*exc)
        events = [e for e in self._profiler.profiler.kineto_results.events() if e.name() == MEMORY_EVENT]
        live = peak = 0
        for e in sorted(events, key=lambda e: e.start_ns()):
            live += e.nbytes()  # frees of tensors older than the profiler are not reported
            peak = max(peak, live)
        self.bytes = peak
