#!/usr/bin/env python3
"""What a memory-bound kernel gets right after FP8 GEMMs: the SM clock and its time.

opfuse's generated kernels run 15-25% slower between the seed MLP's GEMMs than alone
(bench/RESULTS.md). This script measures, on one stream, for three states of the GPU:
  idle        after 50 ms with nothing to do,
  after copy  right after ~10 ms of device copies (memory-bound work, as a kernel test runs),
  after GEMM  right after a burst of the large fc1 FP8 GEMM (torch._scaled_mm, E4M3, fast
              accumulation, 16384 x 28672 x 4096: the seed MLP's biggest GEMM),
  - the SM clock a kernel sees (clock_probe.cu: clock64 cycles over %globaltimer nanoseconds
    while one thread spins 20 us), and
  - the time of a device copy and of torch's layer_norm on the large MLP's [16384, 4096] bf16
    activation (CUDA events around that one call), as GB/s of bytes read + written.
The median over --reps repetitions of each state is reported. Needs nvcc (builds the probe).

  python3 bench/peers/after_gemm.py [--reps 20] [--gemms 4] [--json OUT]
"""

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import torch

import peer_common as common

TOKENS, HIDDEN, FFN = 16384, 4096, 28672
SPIN_NS = 20000


def build_probe(directory):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clock_probe.cu")
    library = os.path.join(directory, "libclock_probe.so")
    subprocess.run([nvcc, "-O2", "-shared", "-Xcompiler", "-fPIC", "-o", library, source],
                   check=True)
    probe = ctypes.CDLL(library)
    probe.clock_probe_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
    probe.clock_probe_launch.restype = ctypes.c_int
    return probe


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="repetitions of each state")
    parser.add_argument("--gemms", type=int, default=4, help="GEMM calls in one burst")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    common.require_cuda()
    info = common.device_info()

    with tempfile.TemporaryDirectory() as directory:
        probe = build_probe(directory)
        stream = torch.cuda.current_stream()
        out = torch.zeros(2, dtype=torch.int64, device="cuda")

        a = torch.randn(TOKENS, HIDDEN, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(FFN, HIDDEN, device="cuda").to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        gamma = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
        beta = torch.zeros(HIDDEN, device="cuda", dtype=torch.bfloat16)
        copy_src = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        copy_dst = torch.empty_like(copy_src)
        nbytes = 2 * x.numel() * x.element_size()  # read + written, both measured kernels

        def gemm_burst():
            for _ in range(args.gemms):
                torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                 use_fast_accum=True)

        def copy_burst():
            for _ in range(12):  # ~3 ms each of 1 GiB moved
                copy_dst.copy_(copy_src)

        def idle():
            torch.cuda.synchronize()
            time.sleep(0.05)

        states = {"idle": idle, "after copy": copy_burst, "after GEMM": gemm_burst}
        kernels = {
            "copy": lambda: y.copy_(x),
            "layer_norm": lambda: torch.nn.functional.layer_norm(x, (HIDDEN,), gamma, beta),
        }
        gemm_burst()
        copy_burst()
        for fn in kernels.values():
            fn()
        torch.cuda.synchronize()

        results = {}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for state, prefix in states.items():
            mhz, times = [], {name: [] for name in kernels}
            for _ in range(args.reps):
                prefix()
                status = probe.clock_probe_launch(stream.cuda_stream, out.data_ptr(), SPIN_NS)
                if status != 0:
                    raise SystemExit(f"clock probe launch failed: cudaError {status}")
                torch.cuda.synchronize()
                cycles, ns = out.tolist()
                mhz.append(cycles * 1000.0 / ns)
                for name, fn in kernels.items():
                    prefix()
                    start.record()
                    fn()
                    end.record()
                    end.synchronize()
                    times[name].append(start.elapsed_time(end))
            results[state] = {"sm_mhz": statistics.median(mhz)}
            for name, values in times.items():
                ms = statistics.median(values)
                results[state][name] = {"ms": ms, "gb_per_s": nbytes / (ms * 1e6)}

    print(f"{info['device']}, torch {info['torch']}, {args.reps} repetitions, "
          f"GEMM burst of {args.gemms} x fc1 fprop ({TOKENS} x {FFN} x {HIDDEN} E4M3)")
    print(f"{'state':>12} {'SM MHz':>8} {'copy us':>9} {'GB/s':>6} {'layer_norm us':>14} {'GB/s':>6}")
    for state, r in results.items():
        print(f"{state:>12} {r['sm_mhz']:8.0f} {1e3 * r['copy']['ms']:9.1f} "
              f"{r['copy']['gb_per_s']:6.0f} {1e3 * r['layer_norm']['ms']:14.1f} "
              f"{r['layer_norm']['gb_per_s']:6.0f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"info": info, "reps": args.reps, "gemms": args.gemms, "results": results},
                      f, indent=2)


if __name__ == "__main__":
    main()
