#!/usr/bin/env python3
"""opfuse's FP8 GEMMs against torch._scaled_mm, interleaved in one process.

A 3% comparison cannot rest on one timing of each side taken minutes apart: on the H100/H200 the
same GEMM timed twice differs by up to 12% (clocks, power, what ran before). So both sides run
here, in one process, on the same operand buffers (rotated over 3x the L2) and the same stream:
opfuse's GEMM through the package (opfuse._opfuse._bench: the GemmRunner an opfuse plan uses)
and torch._scaled_mm. Each of `--rounds` rounds issues the two sides alternately, call by call
(which side goes first alternates between rounds), queued behind a sleep kernel so that CUDA
events time the GPU alone; neighbouring calls see the same clocks and power state. The result per
GEMM is the median over rounds of (opfuse median / torch median), with the rounds' spread, and
whether both sides computed bit-identical results (the same kernel and configuration).

Shapes: the seed MLP's six GEMMs at the medium and large sizes, each with the operand formats and
accumulation the opfuse plan uses: fprop E4M3 x E4M3 with fast accumulation, dgrad and wgrad
E5M2 (the gradient) x E4M3 with split accumulation (TE's defaults); D is bf16.

Both sides call the same cuBLASLt library when torch is imported first (the loader keeps the
first libcublasLt.so.13): the version is printed. A difference left here is in how the library
is asked (algorithm choice, workspace, layouts), not in the library.
"""

import argparse
import gc
import statistics
import sys
import time

import torch

import peer_common as common
from gemm_peers import mlp_gemm_shapes

class OpfuseGemm:
    """opfuse's GEMM runner through the package (opfuse._opfuse._bench: the GemmRunner an opfuse
    plan uses; docs/python.md, "Benchmarks")."""

    def __init__(self, autotune=False):
        from opfuse._opfuse import _bench

        self.autotune = autotune
        self.bench = _bench

    def cublaslt_version(self):
        return int(self.bench.cublaslt_version())

    def call(self, shape, a_e5m2, fast_accum, scale_a, scale_b):
        m, n, k = shape["m"], shape["n"], shape["k"]

        def run(a, b, d):
            self.bench.gemm_run(
                torch.cuda.current_stream().cuda_stream,
                m,
                n,
                k,
                bool(a_e5m2),
                bool(fast_accum),
                bool(self.autotune),
                a.data_ptr(),
                b.data_ptr(),
                d.data_ptr(),
                scale_a.data_ptr(),
                scale_b.data_ptr(),
                1,
            )

        return run


def variant_of(gemm):
    """(a_e5m2, fast_accum) as the opfuse plan runs this GEMM."""
    return (False, True) if gemm.endswith("fprop") else (True, False)


def measure(shape, opfuse, args):
    m, n, k = shape["m"], shape["n"], shape["k"]
    a_e5m2, fast_accum = variant_of(shape["gemm"])
    bytes_per_set = (m + n) * k + 2 * m * n
    count = common.rotation_count(bytes_per_set)
    sets = []
    for _ in range(count):
        a = torch.randn(m, k, device=common.DEVICE, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=common.DEVICE, dtype=torch.bfloat16)
        a = a.to(torch.float8_e5m2 if a_e5m2 else torch.float8_e4m3fn)
        b = b.to(torch.float8_e4m3fn)
        d = torch.empty(m, n, device=common.DEVICE, dtype=torch.bfloat16)
        sets.append([a, b, d])
    # Each scale in its own 16-byte aligned allocation (cuBLASLt 13 needs it; the caching
    # allocator gives 512).
    scale_a = torch.tensor([0.5], device=common.DEVICE)
    scale_b = torch.tensor([0.25], device=common.DEVICE)

    def torch_call(a, b, d):
        return torch._scaled_mm(
            a,
            b.t(),
            scale_a=scale_a,
            scale_b=scale_b,
            out_dtype=torch.bfloat16,
            use_fast_accum=fast_accum,
            out=d,
        )

    sides = {
        "opfuse": opfuse.call(shape, a_e5m2, fast_accum, scale_a, scale_b),
        "torch": torch_call,
    }
    # Same result from both (FP8 products are exact in fp32; only summation order may differ);
    # bit-identical results mean the same kernel with the same configuration ran on both sides.
    a, b, d = sets[0]
    sides["opfuse"](a, b, d)
    expected = torch_call(a, b, torch.empty_like(d))
    rel_err = common.relative_error(d, expected)
    same_bits = bool(torch.equal(d, expected))
    flops = 2 * m * n * k
    big = m * n * k >= 2**36
    iters = args.iters_large if big else args.iters_medium
    per_round, ratios = interleaved_rounds(sides, sets, args.rounds, iters)
    del sets
    torch.cuda.empty_cache()
    opfuse_ms = statistics.median(per_round["opfuse"])
    torch_ms = statistics.median(per_round["torch"])
    return {
        **shape,
        "variant": ("E5M2" if a_e5m2 else "E4M3") + "xE4M3" + (" fast" if fast_accum else ""),
        "opfuse_ms": opfuse_ms,
        "torch_ms": torch_ms,
        "opfuse_tflops": flops / (opfuse_ms * 1e-3) / 1e12,
        "torch_tflops": flops / (torch_ms * 1e-3) / 1e12,
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "rounds": args.rounds,
        "iters": iters,
        "opfuse_rounds_ms": per_round["opfuse"],
        "torch_rounds_ms": per_round["torch"],
        "rel_err": rel_err,
        "same_bits": same_bits,
    }


def interleaved_rounds(sides, sets, rounds, iters):
    """Both of `sides` ({name: call}, two entries) warmed (5 calls each: plans, clocks), their
    host time per call estimated for the hold, then `rounds` rounds of `iters` alternating calls
    each (alternate), which side goes first switching every round. Returns the per-round medians
    {name: [ms, ...]} and the per-round ratios first side / second side."""
    for call in sides.values():
        common._run_calls(call, sets, 5)
    torch.cuda.synchronize()
    host_s = 0.0
    for call in sides.values():
        began = time.perf_counter()
        common._run_calls(call, sets, 10)
        host_s = max(host_s, (time.perf_counter() - began) / 10)
    torch.cuda.synchronize()
    names = list(sides)
    per_round = {name: [] for name in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        times = alternate([sides[name] for name in order], sets, iters, host_s)
        for name, side_times in zip(order, times, strict=True):
            per_round[name].append(statistics.median(side_times))
    first, second = names
    ratios = [a / b for a, b in zip(per_round[first], per_round[second], strict=True)]
    return per_round, ratios


def alternate(calls, sets, iters, host_seconds_per_call):
    """Device times (ms) of `iters` calls of each of the two `calls`, issued alternately (first,
    second, first, ...) on rotated operands and queued behind a sleep kernel so that the events
    time the GPU alone. Neighbouring calls see the same clocks and power state, which drift by up
    to 12% over a few hundred ms on these GPUs under FP8 GEMM load."""
    host_seconds = len(calls) * iters * host_seconds_per_call
    hold = int((2.0 * host_seconds + 1e-4) * common.SLEEP_CLOCK_HZ)
    events = [
        [[torch.cuda.Event(enable_timing=True) for _ in range(2)] for _ in calls]
        for _ in range(iters)
    ]
    gc.collect()
    gc.disable()
    try:
        torch.cuda._sleep(hold)
        for i in range(iters):
            args = sets[i % len(sets)]
            for call, (start, end) in zip(calls, events[i], strict=True):
                start.record()
                call(*args)
                end.record()
        torch.cuda.synchronize()
    finally:
        gc.enable()
    times = [[] for _ in calls]
    for pairs in events:
        for side_times, (start, end) in zip(times, pairs, strict=True):
            side_times.append(start.elapsed_time(end))
    return times


COLUMNS = [
    ("size", "size", ""),
    ("gemm", "gemm", ""),
    ("m", "m", "d"),
    ("n", "n", "d"),
    ("k", "k", "d"),
    ("operands", "variant", ""),
    ("opfuse ms", "opfuse_ms", ".4f"),
    ("torch ms", "torch_ms", ".4f"),
    ("opfuse TFLOP/s", "opfuse_tflops", ".0f"),
    ("x torch", "ratio", ".3f"),
    ("min", "ratio_min", ".3f"),
    ("max", "ratio_max", ".3f"),
    ("rel err", "rel_err", ".1e"),
    ("same bits", "same_bits", ""),
]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here (rewritten after every GEMM)")
    parser.add_argument("--sizes", default="medium,large", help="comma list of medium,large")
    parser.add_argument("--rounds", type=int, default=12, help="rounds per GEMM")
    parser.add_argument("--iters-large", type=int, default=30, help="calls per side and round")
    parser.add_argument("--iters-medium", type=int, default=200, help="calls per side and round")
    parser.add_argument(
        "--gemm-autotune",
        action="store_true",
        help="opfuse's runner autotunes (GemmOptions::autotune) instead of taking the heuristic's"
        " first algorithm ('same bits' then says whether the results agree, not that the"
        " algorithm is torch's)",
    )
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    args.sizes = common.parse_list(args.sizes, ["medium", "large"], "sizes")
    if args.rounds < 2:
        raise SystemExit("--rounds must be at least 2 (the sides alternate)")
    return args


def main(argv):
    args = parse_args(argv)
    common.require_cuda()
    common.print_banner("gemm_interleaved")
    opfuse = OpfuseGemm(args.gemm_autotune)
    version = opfuse.cublaslt_version()
    print(f"# cuBLASLt {version} in this process (both sides)", flush=True)
    report = common.JsonReport(
        args.json, "gemm_interleaved", {**vars(args), "cublaslt_version": version}
    )
    rows = []
    for size in args.sizes:
        for shape in mlp_gemm_shapes(size):
            common.seed_everything(args.seed)
            try:
                row = {
                    **measure(shape, opfuse, args),
                    "gemm_algorithms": "autotuned" if args.gemm_autotune else "heuristic",
                }
            except Exception as error:  # one failing shape must not cost the others
                message = common.error_line(error)
                print(f"FAILED {size} {shape['gemm']}: {message}", flush=True)
                report.add({**shape, "error": message})
                continue
            rows.append(row)
            report.add(row)
            print(
                f"{size} {shape['gemm']}: x{row['ratio']:.3f} "
                f"[{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]",
                flush=True,
            )
    print(common.format_table(COLUMNS, rows))
    if rows:
        worst = max(rows, key=lambda r: r["ratio"])
        print(f"worst: {worst['size']} {worst['gemm']} x{worst['ratio']:.3f} (goal <= 1.03)")
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
