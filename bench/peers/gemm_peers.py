#!/usr/bin/env python3
"""The MLP's GEMMs alone: torch._scaled_mm FP8 and bf16 torch.matmul, the GEMM peers of opfuse.

Shapes: fprop, dgrad and wgrad of both linears of the seed MLP at each size, and 8192^3 as the
ceiling. Every GEMM is D[m, n] = A[m, k] @ B[n, k]^T with both operands K-contiguous (the TN layout
that cuBLASLt FP8 requires on Hopper), so bf16 and FP8 run the same layout. FP8 is E4M3 x E4M3 ->
bf16 with per-tensor scales, with fast accumulation on (TE's fprop default) and off (its
dgrad/wgrad default); `fp8_e5m2` is E5M2 x E4M3 without fast accumulation, what TE's and
opfuse's dgrad and wgrad GEMMs run (the gradient in E5M2 as A).
"""

import argparse
import sys

import torch

import peer_common as common

VARIANTS = ["bf16", "fp8_fast", "fp8", "fp8_e5m2"]
CEILING = {"size": "ceiling", "gemm": "8192^3", "m": 8192, "n": 8192, "k": 8192}


def mlp_gemm_shapes(size_name):
    """(gemm, m, n, k) of the six GEMMs of one forward and backward of the MLP."""
    size = common.MLP_SIZES[size_name]
    tokens, hidden, ffn = size["tokens"], size["hidden"], size["ffn"]
    half = ffn // 2
    shapes = [
        ("fc1 fprop", tokens, ffn, hidden),
        ("fc1 dgrad", tokens, hidden, ffn),
        ("fc1 wgrad", ffn, hidden, tokens),
        ("fc2 fprop", tokens, hidden, half),
        ("fc2 dgrad", tokens, half, hidden),
        ("fc2 wgrad", hidden, half, tokens),
    ]
    return [{"size": size_name, "gemm": g, "m": m, "n": n, "k": k} for g, m, n, k in shapes]


def make_operands(shape, variant, count):
    m, n, k = shape["m"], shape["n"], shape["k"]
    sets = []
    for _ in range(count):
        a = torch.randn(m, k, device=common.DEVICE, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=common.DEVICE, dtype=torch.bfloat16)
        if variant != "bf16":
            # Unit-variance data is well inside E4M3's range; the scales only have to be real.
            a = a.to(torch.float8_e5m2 if variant == "fp8_e5m2" else torch.float8_e4m3fn)
            b = b.to(torch.float8_e4m3fn)
        sets.append([a, b])
    return sets


def gemm_call(variant):
    if variant == "bf16":
        return lambda a, b: torch.matmul(a, b.t())
    scale_a = torch.tensor(0.5, device=common.DEVICE)
    scale_b = torch.tensor(0.25, device=common.DEVICE)
    fast_accum = variant == "fp8_fast"

    def scaled(a, b):
        return torch._scaled_mm(
            a,
            b.t(),
            scale_a=scale_a,
            scale_b=scale_b,
            out_dtype=torch.bfloat16,
            use_fast_accum=fast_accum,
        )

    return scaled


def check_fp8(call, a, b):
    """FP8 values are exact in bf16, so the GEMM must match a bf16 matmul of the same values."""
    expected = torch.matmul(a.to(torch.bfloat16), b.to(torch.bfloat16).t()).float() * (0.5 * 0.25)
    return common.relative_error(call(a, b), expected)


def measure(shape, variant, args):
    bytes_per_set = (shape["m"] + shape["n"]) * shape["k"] * (2 if variant == "bf16" else 1)
    sets = make_operands(shape, variant, common.rotation_count(bytes_per_set))
    call = gemm_call(variant)
    error = None if variant == "bf16" else check_fp8(call, *sets[0])
    big = shape["m"] * shape["n"] * shape["k"] >= 2**36
    timing = common.time_device(
        call, sets, min_iters=50 if big else 200, max_iters=5000, target_seconds=args.target_seconds
    )
    flops = 2 * shape["m"] * shape["n"] * shape["k"]
    del sets
    torch.cuda.empty_cache()
    return {
        **shape,
        "variant": variant,
        **timing,
        "tflops": flops / (timing["median_ms"] * 1e-3) / 1e12,
        "rel_err": error,
    }


COLUMNS = [
    ("size", "size", ""),
    ("gemm", "gemm", ""),
    ("m", "m", "d"),
    ("n", "n", "d"),
    ("k", "k", "d"),
    ("variant", "variant", ""),
    ("ms", "median_ms", ".4f"),
    ("TFLOP/s", "tflops", ".1f"),
    ("gpu ms", "gpu_median_ms", ".4f"),
    ("gap us", "gpu_gap_us", ".1f"),
    ("iters", "iters", "d"),
    ("sets", "rotation_sets", "d"),
    ("rel err", "rel_err", ".1e"),
]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here (rewritten after every measurement)")
    parser.add_argument(
        "--sizes", default="tiny,medium,large", help="comma list of tiny,medium,large"
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help=",".join(VARIANTS))
    parser.add_argument("--no-ceiling", action="store_true", help="skip the 8192^3 GEMM")
    parser.add_argument(
        "--target-seconds", type=float, default=0.3, help="timed span per measurement"
    )
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    args.sizes = common.parse_list(args.sizes, common.SIZE_ORDER, "sizes")
    args.sizes = [s for s in common.SIZE_ORDER if s in args.sizes]
    args.variants = common.parse_list(args.variants, VARIANTS, "variants")
    return args


def main(argv):
    args = parse_args(argv)
    common.require_cuda()
    common.print_banner("gemm_peers")
    report = common.JsonReport(args.json, "gemm_peers", dict(vars(args)))
    shapes = [shape for size in args.sizes for shape in mlp_gemm_shapes(size)]
    if not args.no_ceiling:
        shapes.append(dict(CEILING))
    rows = []
    for shape in shapes:
        for variant in args.variants:
            common.seed_everything(args.seed)
            try:
                row = measure(shape, variant, args)
            except Exception as error:  # one failing shape must not cost the others
                message = common.error_line(error)
                print(f"FAILED {shape['gemm']} {variant}: {message}", flush=True)
                report.add({**shape, "variant": variant, "error": message})
                continue
            rows.append(row)
            report.add(row)
    by_shape = {}
    for row in rows:
        by_shape.setdefault((row["size"], row["gemm"]), {})[row["variant"]] = row
    for row in rows:
        bf16 = by_shape[(row["size"], row["gemm"])].get("bf16")
        row["vs_bf16"] = bf16["median_ms"] / row["median_ms"] if bf16 else None
    print(common.format_table(COLUMNS + [("x bf16", "vs_bf16", ".2f")], rows))
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
