#!/usr/bin/env python3
"""The seed MLP tensor-parallel in PyTorch (torch.distributed over NCCL, one process per GPU): the
peer of `fusec bench --nproc N` on bench/workloads/mlp_large_tp.fuse.

Megatron's (and TE's) layout, the one opfuse's `linear(..., parallel = column | row)` builds:
LayerNorm (replicated parameters) -> fc1 column-parallel (each rank holds ffn / tp rows: its
slices of the gate and of the value half, so SwiGLU needs no communication) -> SwiGLU -> fc2
row-parallel (each rank holds ffn / 2 / tp input columns) -> the partial sums reduced. Without
sequence parallelism (sp = false) the input is whole on every rank, the output all-reduced, and
the backward all-reduces fc1's input gradient; with it (sp = true) each rank holds tokens / tp
rows, LayerNorm's output is all-gathered before fc1 and fc2's output reduce-scattered (the
backward: reduce-scatter and all-gather). tp = 1 is the plain one-GPU model (no collectives), for
the scaling efficiency.

Variants: eager bf16; compile (torch.compile of the two compute regions between the collectives,
bf16); compile_fp8 (the same regions with mlp_peers.py's FP8 linears: current scaling per rank,
torch._scaled_mm, E4M3 forward and E5M2 gradients). Mode fwdbwd: forward, then the backward of
sum(y * grad) for a fixed random grad (input and parameter gradients, no optimizer step), as
mlp_peers.py; fwd: forward under no_grad.

Timing: every rank runs the same iterations (they meet in the collectives); CUDA events around
each iteration on rank 0 after a warm-up, median (p10, p90); two input sets rotated.

  python3 bench/peers/mlp_tp.py --nproc 2 --json peers_tp2.json
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlp_peers  # noqa: E402  (the FP8 linear and its quantizer)
import peer_common as common  # noqa: E402

SIZES = {"large": {"tokens": 16384, "hidden": 4096, "ffn": 28672}}
VARIANTS = ["eager", "compile", "compile_fp8"]


# --- the collectives as autograd functions (Megatron's f, g and their sequence-parallel forms) ---


class CopyToRanks(torch.autograd.Function):
    """Forward: the input as it is (whole on every rank); backward: the sum over the ranks."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class ReduceFromRanks(torch.autograd.Function):
    """Forward: the sum of the ranks' partial outputs; backward: the gradient as it is."""

    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def gather_tokens(x):
    """Every rank's token rows stacked, rank-major (all-gather along dim 0)."""
    world = dist.get_world_size()
    out = torch.empty((x.shape[0] * world, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous())
    return out


def scatter_tokens(x):
    """The sum over the ranks, each keeping its block of token rows (reduce-scatter, dim 0)."""
    world = dist.get_world_size()
    out = torch.empty((x.shape[0] // world, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x.contiguous())
    return out


class GatherTokens(torch.autograd.Function):
    """Forward: all-gather of the token rows; backward: reduce-scatter."""

    @staticmethod
    def forward(ctx, x):
        return gather_tokens(x)

    @staticmethod
    def backward(ctx, grad):
        return scatter_tokens(grad)


class ScatterTokens(torch.autograd.Function):
    """Forward: reduce-scatter of the token rows; backward: all-gather."""

    @staticmethod
    def forward(ctx, x):
        return scatter_tokens(x)

    @staticmethod
    def backward(ctx, grad):
        return gather_tokens(grad)


# --- the model: two compute regions between the collectives ---


def norm(x, ln_weight, ln_bias):
    return F.layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, eps=1e-5)


def fc1_swiglu_fc2_bf16(h, fc1_weight, fc2_weight):
    h = F.linear(h, fc1_weight)
    gate, value = h.chunk(2, dim=-1)
    return F.linear(F.silu(gate) * value, fc2_weight)


def fc1_swiglu_fc2_fp8(h, fc1_weight, fc2_weight):
    h = mlp_peers.Fp8Linear.apply(h, fc1_weight)
    gate, value = h.chunk(2, dim=-1)
    return mlp_peers.Fp8Linear.apply(F.silu(gate) * value, fc2_weight)


def build_model(variant, tp, sp):
    """(x, ln_weight, ln_bias, fc1_weight, fc2_weight) -> y for this rank's shards."""
    region = fc1_swiglu_fc2_fp8 if variant == "compile_fp8" else fc1_swiglu_fc2_bf16
    norm_fn = norm
    if variant != "eager":
        torch._dynamo.reset()
        region = torch.compile(region, dynamic=False)
        norm_fn = torch.compile(norm, dynamic=False)

    def model(x, ln_weight, ln_bias, fc1_weight, fc2_weight):
        h = norm_fn(x, ln_weight, ln_bias)
        if tp > 1:
            h = GatherTokens.apply(h) if sp else CopyToRanks.apply(h)
        y = region(h, fc1_weight, fc2_weight)
        if tp > 1:
            y = ScatterTokens.apply(y) if sp else ReduceFromRanks.apply(y)
        return y

    return model


def make_arg_set(size, tp, sp, rank, seed, requires_grad):
    """This rank's shards of one random model and input (each rank draws its own: the times do
    not depend on the values)."""
    torch.manual_seed(seed * 1000 + rank)
    tokens, hidden, ffn = size["tokens"], size["hidden"], size["ffn"]
    rows = tokens // tp if sp else tokens
    options = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(rows, hidden, **options)
    ln_weight = 1 + 0.1 * torch.randn(hidden, **options)
    ln_bias = 0.1 * torch.randn(hidden, **options)
    fc1_weight = torch.randn(ffn // tp, hidden, **options) * hidden**-0.5
    fc2_weight = torch.randn(hidden, ffn // 2 // tp, **options) * (ffn // 2) ** -0.5
    inputs = [x, ln_weight, ln_bias, fc1_weight, fc2_weight]
    for tensor in inputs:
        tensor.requires_grad_(requires_grad)
    grad = torch.randn(rows, hidden, **options)
    return inputs, grad


def gemm_flops(size, mode, tp):
    """GEMM flops of ONE rank per iteration (the whole model's over tp)."""
    tokens, hidden, ffn = size["tokens"], size["hidden"], size["ffn"]
    forward = 2 * tokens * ffn * hidden + 2 * tokens * hidden * (ffn // 2)
    return (forward if mode == "fwd" else 3 * forward) / tp


def make_call(model, mode):
    if mode == "fwd":

        def forward(inputs, grad):
            with torch.no_grad():
                return model(*inputs)

        return forward

    def forward_backward(inputs, grad):
        y = model(*inputs)
        return torch.autograd.grad(y, inputs, grad_outputs=grad)

    return forward_backward


def measure(call, sets, warmup, iters):
    for i in range(warmup):
        call(*sets[i % len(sets)])
    torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        call(*sets[i % len(sets)])
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return {
        "median_ms": statistics.median(times),
        "p10_ms": pick(0.1),
        "p90_ms": pick(0.9),
        "iters": iters,
    }


def rank_main(rank, world, args, init_file, result_file):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    if world > 1:
        dist.init_process_group(
            "nccl",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world,
            device_id=torch.device("cuda", rank),
        )
    rows = []
    size = SIZES[args.size]
    for sp in [False, True] if world > 1 and args.sp == "both" else [args.sp == "true"]:
        for mode in args.modes.split(","):
            sets = [
                make_arg_set(size, world, sp, rank, seed, mode == "fwdbwd") for seed in (1, 2)
            ]
            for variant in args.variants.split(","):
                model = build_model(variant, world, sp)
                call = make_call(model, mode)
                began = time.perf_counter()
                call(*sets[0])  # compiles a compiled variant
                torch.cuda.synchronize()
                first_call_s = time.perf_counter() - began
                timing = measure(call, sets, args.warmup, args.iters)
                flops = gemm_flops(size, mode, world)
                rows.append(
                    {
                        "size": args.size,
                        **size,
                        "tp": world,
                        "sp": sp if world > 1 else None,
                        "mode": mode,
                        "variant": variant,
                        **timing,
                        "tflops_per_gpu": flops / (timing["median_ms"] * 1e-3) / 1e12,
                        "first_call_s": first_call_s,
                        "device": torch.cuda.get_device_name(rank),
                    }
                )
                if rank == 0:
                    r = rows[-1]
                    print(
                        f"tp {world} sp {str(sp).lower():5} {mode:6} {variant:12} "
                        f"median {r['median_ms']:.4f} ms (p10 {r['p10_ms']:.4f}, p90 "
                        f"{r['p90_ms']:.4f}), {r['tflops_per_gpu']:.0f} TFLOP/s per GPU, "
                        f"first call {first_call_s:.1f} s",
                        flush=True,
                    )
            del sets
            torch.cuda.empty_cache()
    if rank == 0:
        with open(result_file, "w") as f:
            json.dump(rows, f)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=torch.cuda.device_count())
    parser.add_argument("--size", default="large", choices=sorted(SIZES))
    parser.add_argument("--modes", default="fwdbwd")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--sp", default="false", choices=["false", "true", "both"])
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    common.require_cuda()
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            parser.error(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    if args.nproc < 1 or args.nproc > torch.cuda.device_count():
        parser.error(f"--nproc {args.nproc}: this machine has {torch.cuda.device_count()} GPUs")
    size = SIZES[args.size]
    if size["ffn"] // 2 % args.nproc or size["tokens"] % args.nproc:
        parser.error(f"--nproc {args.nproc} does not divide the {args.size} sizes")
    with tempfile.TemporaryDirectory() as work:
        init_file = os.path.join(work, "init")
        result_file = os.path.join(work, "rows.json")
        if args.nproc == 1:
            rank_main(0, 1, args, init_file, result_file)
        else:
            mp.spawn(rank_main, args=(args.nproc, args, init_file, result_file), nprocs=args.nproc)
        with open(result_file) as f:
            rows = json.load(f)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"script": "mlp_tp.py", "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
