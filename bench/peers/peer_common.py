"""Shared pieces of the PyTorch peer benchmarks: workload sizes, timing, JSON and tables.

Every script times the same way (docs/design.md, "Benchmarks"): CUDA events around each call after a
warm-up, the median of many calls, and the calls' inputs rotated over enough preallocated buffers
that the L2 cache cannot hold them all, so a small problem is not flattered by a warm cache.
"""

import datetime
import gc
import json
import math
import os
import statistics
import time

import torch

# The seed MLP of dsl_examples/mlp.fuse at the three sizes.
MLP_SIZES = {
    "large": {"tokens": 16384, "hidden": 4096, "ffn": 28672},
    "medium": {"tokens": 4096, "hidden": 1024, "ffn": 8192},
    "tiny": {"tokens": 32, "hidden": 256, "ffn": 1024},
}
SIZE_ORDER = ["tiny", "medium", "large"]

# Where the benchmarks put their tensors; only a CPU smoke test of the scripts' logic changes it.
DEVICE = "cuda"

E4M3_MAX = 448.0
E5M2_MAX = 57344.0

# Rotated inputs must add up to at least this many L2 caches before a problem counts as cold.
L2_MULTIPLE = 3
MAX_ROTATION_SETS = 512


def parse_list(text, allowed, what):
    """Splits a comma-separated flag value and rejects names the script does not know."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in items if item not in allowed]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(allowed)})")
    return items


def require_cuda():
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch: the peer benchmarks need a GPU")


def device_info():
    props = torch.cuda.get_device_properties(0)
    return {
        "device": props.name,
        "multiprocessors": props.multi_processor_count,
        "l2_bytes": l2_bytes(),
        "memory_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def l2_bytes():
    # Older torch builds lack the field; 60 MB is the H200's L2 and errs on the cold side.
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 * 1024 * 1024)


def rotation_count(bytes_per_set):
    """How many copies of one call's inputs are needed so that cycling them misses the L2."""
    wanted = math.ceil(L2_MULTIPLE * l2_bytes() / max(bytes_per_set, 1))
    return max(2, min(MAX_ROTATION_SETS, wanted))


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def seed_everything(seed):
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def _run_calls(call, arg_sets, count, start_index=0):
    for i in range(count):
        call(*arg_sets[(start_index + i) % len(arg_sets)])


def time_device(call, arg_sets, min_iters, max_iters, target_seconds, warmup=5):
    """Median device time of `call` in milliseconds, CUDA events around each call.

    The iteration count comes from a short estimate so that each measurement takes about
    `target_seconds`, bounded by `min_iters` and `max_iters`. Two numbers come back: `median_ms`,
    the calls issued one after another as a program would (a small problem includes the gaps
    while the GPU waits for the host), and `gpu_median_ms`, the same calls queued behind a sleep
    kernel so the events see device execution alone (see time_device_queued).
    """
    _run_calls(call, arg_sets, warmup)
    torch.cuda.synchronize()
    probe = max(3, min(20, len(arg_sets)))
    began = time.perf_counter()
    _run_calls(call, arg_sets, probe)
    enqueued = time.perf_counter()
    torch.cuda.synchronize()
    per_call = (time.perf_counter() - began) / probe
    host_per_call = (enqueued - began) / probe
    iters = int(max(min_iters, min(max_iters, target_seconds / max(per_call, 1e-7))))

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    gc.collect()
    gc.disable()
    try:
        for i in range(iters):
            args = arg_sets[i % len(arg_sets)]
            starts[i].record()
            call(*args)
            ends[i].record()
        torch.cuda.synchronize()
    finally:
        gc.enable()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
    result = {
        "median_ms": statistics.median(times),
        "min_ms": times[0],
        "p90_ms": times[min(len(times) - 1, int(0.9 * len(times)))],
        "iters": iters,
        "rotation_sets": len(arg_sets),
    }
    result.update(time_device_queued(call, arg_sets, min(iters, 1000), host_per_call))
    return result


# Clock the sleep kernel's cycle count is converted with: about the H100/H200 boost clock. A lower
# real clock only makes the hold longer, which is harmless.
SLEEP_CLOCK_HZ = 2.0e9
QUEUED_CHUNK = 16


def time_device_queued(call, arg_sets, iters, host_seconds_per_call):
    """Device-only time of `call`: torch.cuda._sleep holds the stream while the host enqueues a
    chunk of calls, so back-to-back events time the GPU's own work, as a graph replay or a C++
    caller would see it. `gpu_gap_us` is the median idle time between calls inside a chunk: near
    zero when the hold was long enough, which is what makes `gpu_median_ms` trustworthy."""
    hold_cycles = int((2.0 * QUEUED_CHUNK * host_seconds_per_call + 1e-4) * SLEEP_CLOCK_HZ)
    try:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        gc.collect()
        gc.disable()
        try:
            for begin in range(0, iters, QUEUED_CHUNK):
                torch.cuda._sleep(hold_cycles)
                for i in range(begin, min(iters, begin + QUEUED_CHUNK)):
                    starts[i].record()
                    call(*arg_sets[i % len(arg_sets)])
                    ends[i].record()
            torch.cuda.synchronize()
        finally:
            gc.enable()
        times = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
        gaps = [
            ends[i].elapsed_time(starts[i + 1]) * 1e3
            for i in range(iters - 1)
            if (i + 1) % QUEUED_CHUNK != 0
        ]
    except Exception as error:  # an auxiliary column: losing it must not lose the measurement
        print(f"queued timing unavailable: {str(error).splitlines()[0]}", flush=True)
        return {"gpu_median_ms": None, "gpu_gap_us": None}
    return {
        "gpu_median_ms": statistics.median(times),
        "gpu_gap_us": statistics.median(gaps) if gaps else None,
    }


def time_host(call, arg_sets, iters, warmup=20):
    """Median host time of one call in microseconds: the launch cost, no synchronization."""
    _run_calls(call, arg_sets, warmup)
    torch.cuda.synchronize()
    samples = []
    gc.collect()
    gc.disable()
    try:
        for i in range(iters):
            args = arg_sets[i % len(arg_sets)]
            began = time.perf_counter()
            call(*args)
            samples.append(time.perf_counter() - began)
        torch.cuda.synchronize()
    finally:
        gc.enable()
    return statistics.median(samples) * 1e6


def peak_memory_bytes(call, args):
    """Device memory one call needs on top of what is already allocated (its inputs excluded)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = call(*args)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del result
    return peak - before


def error_line(error):
    """An exception as one line for a table or JSON: its type and its message's first line."""
    first_line = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {first_line}"


def relative_error(value, reference):
    """Relative L2 error of one tensor against another, computed in fp32."""
    value = value.float()
    reference = reference.float()
    return ((value - reference).norm() / reference.norm().clamp_min(1e-30)).item()


class JsonReport:
    """Rewritten after every measurement: a run cut off by a time limit keeps its numbers."""

    def __init__(self, path, script, settings):
        self.path = path
        self.data = {"script": script, **device_info(), "settings": settings, "results": []}
        self.write()

    def add(self, record):
        self.data["results"].append(record)
        self.write()

    def write(self):
        if not self.path:
            return
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        temporary = self.path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(self.data, handle, indent=1)
        os.replace(temporary, self.path)


def format_table(columns, rows):
    """A compact fixed-width table: `columns` are (header, key, format) triples over dict rows."""
    cells = []
    for row in rows:
        line = []
        for _, key, spec in columns:
            value = row.get(key)
            line.append("-" if value is None else format(value, spec) if spec else str(value))
        cells.append(line)
    widths = [len(header) for header, _, _ in columns]
    for line in cells:
        widths = [max(width, len(cell)) for width, cell in zip(widths, line, strict=True)]
    header = "  ".join(h.rjust(w) for (h, _, _), w in zip(columns, widths, strict=True))
    body = [
        "  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)) for line in cells
    ]
    return "\n".join([header, "-" * len(header), *body])


def print_banner(script):
    info = device_info()
    print(
        f"# {script}: {info['device']} ({info['multiprocessors']} SMs, "
        f"L2 {info['l2_bytes'] / 2**20:.0f} MiB), torch {info['torch']}, CUDA {info['cuda']}",
        flush=True,
    )
