#!/usr/bin/env python3
"""Device-to-device copy bandwidth: the ceiling for opfuse's fused memory-bound kernels.

Bandwidth counts the bytes read plus the bytes written. Sizes are the MLP's activations (and a
small one that would sit in L2 if it were not rotated over several buffers).
"""

import argparse
import sys

import torch

import peer_common as common

# (name, rows, columns) of bf16 tensors the MLP moves.
SHAPES = {
    "x_medium": (4096, 1024),
    "x_large": (16384, 4096),
    "swiglu_out_large": (16384, 14336),
    "fc1_out_large": (16384, 28672),
    "8192x57344": (8192, 57344),
}


def measure(name, rows, columns, args):
    bytes_per_copy = rows * columns * 2
    count = common.rotation_count(2 * bytes_per_copy)
    pairs = []
    for _ in range(count):
        source = torch.randn(rows, columns, device=common.DEVICE, dtype=torch.bfloat16)
        pairs.append([source, torch.empty_like(source)])
    timing = common.time_device(
        lambda source, destination: destination.copy_(source),
        pairs,
        min_iters=100,
        max_iters=5000,
        target_seconds=args.target_seconds,
    )
    del pairs
    torch.cuda.empty_cache()
    moved = 2 * bytes_per_copy
    return {
        "shape": name,
        "rows": rows,
        "columns": columns,
        "mbytes_moved": moved / 1e6,
        **timing,
        "tb_per_s": moved / (timing["median_ms"] * 1e-3) / 1e12,
        "gpu_tb_per_s": (
            moved / (timing["gpu_median_ms"] * 1e-3) / 1e12 if timing["gpu_median_ms"] else None
        ),
    }


COLUMNS = [
    ("shape", "shape", ""),
    ("rows", "rows", "d"),
    ("columns", "columns", "d"),
    ("MB moved", "mbytes_moved", ".1f"),
    ("ms", "median_ms", ".4f"),
    ("TB/s", "tb_per_s", ".2f"),
    ("gpu ms", "gpu_median_ms", ".4f"),
    ("gpu TB/s", "gpu_tb_per_s", ".2f"),
    ("gap us", "gpu_gap_us", ".1f"),
    ("iters", "iters", "d"),
    ("sets", "rotation_sets", "d"),
]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here (rewritten after every measurement)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=",".join(SHAPES))
    parser.add_argument(
        "--target-seconds", type=float, default=0.3, help="timed span per measurement"
    )
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    args.shapes = common.parse_list(args.shapes, list(SHAPES), "shapes")
    return args


def main(argv):
    args = parse_args(argv)
    common.require_cuda()
    common.print_banner("copy_bw")
    report = common.JsonReport(args.json, "copy_bw", dict(vars(args)))
    common.seed_everything(args.seed)
    rows = []
    for name in args.shapes:
        row = measure(name, *SHAPES[name], args)
        rows.append(row)
        report.add(row)
    print(common.format_table(COLUMNS, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
