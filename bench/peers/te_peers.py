#!/usr/bin/env python3
"""The seed MLP block in Transformer Engine: TE as a measured peer (issue 22).

The block of dsl_examples/mlp.fuse as TE's operation fuser builds it: te.ops.Sequential of
LayerNorm(hidden, eps 1e-5, with bias) -> Linear(hidden -> ffn, no bias) -> SwiGLU (first half
the gate) -> Linear(ffn / 2 -> hidden, no bias), bf16 parameters and input, at the sizes of
bench/workloads/mlp_{tiny,medium,large}.fuse (peer_common.MLP_SIZES).

Variants (TE's recipes): te_bf16 (no autocast), te_fp8_delayed (DelayedScaling HYBRID, history
1024, max: as bench/workloads' fp8_delayed), te_fp8_current (Float8CurrentScaling),
te_fp8_block (Float8BlockScaling, where TE says the GPU supports it).
Modes: fwd (inference: no autograd, as `fusec bench --mode fwd`), fwd_train (the forward of a
training step: autograd records), fwdbwd (forward, then the backward of sum(y * grad): input and
parameter gradients, no optimizer step, as `fusec bench --mode fwdbwd`).

Timing as bench/peers/mlp_peers.py (peer_common.time_device): back-to-back median and the
device-only median behind a sleep kernel, inputs rotated over enough sets to miss the L2 (the
parameters are the module's own, as opfuse's session keeps its parameters). Each variant's first
forward output is checked against an eager PyTorch model of the same block with the same weights
(rel_err_vs_eager), so a TE build that computes something else shows up in the table (delayed
scaling's first forward casts with scale 1, before any amax: about 1e-1 there).

Writes --json as the other peers do (bench/compare.py reads it as peers_te.json). Needs
transformer_engine.pytorch importable: bench/peers/te_env.sh installs it from the offline kit.
"""

import argparse
import sys
import time

import torch
import torch.nn.functional as F

import peer_common as common

VARIANTS = ["te_bf16", "te_fp8_delayed", "te_fp8_current", "te_fp8_block"]
MODES = ["fwd", "fwd_train", "fwdbwd"]


def import_te():
    try:
        import transformer_engine
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe
    except ImportError as error:
        sys.exit(f"te_peers: transformer_engine.pytorch does not import ({error}); "
                 "source bench/peers/te_env.sh with TE_KIT set first")
    return transformer_engine, te, recipe


def make_recipe(te, recipe, variant):
    """The TE recipe of a variant, or a reason it cannot run here."""
    if variant == "te_bf16":
        return None, None
    if variant == "te_fp8_delayed":
        return recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID, amax_history_len=1024,
                                     amax_compute_algo="max"), None
    if variant == "te_fp8_current":
        return recipe.Float8CurrentScaling(), None
    available, why = te.is_fp8_block_scaling_available(return_reason=True)
    if not available:
        return None, f"Float8BlockScaling unavailable: {why}"
    return recipe.Float8BlockScaling(), None


def autocast(te, fp8_recipe):
    """TE 2.x's FP8 context (te.autocast; fp8_autocast in older releases)."""
    context = getattr(te, "autocast", None) or te.fp8_autocast
    return context(enabled=fp8_recipe is not None, recipe=fp8_recipe)


def build_block(te, size):
    hidden, ffn = size["hidden"], size["ffn"]
    options = {"device": common.DEVICE, "dtype": torch.bfloat16}
    block = te.ops.Sequential(
        te.ops.LayerNorm(hidden, eps=1e-5, **options),
        te.ops.Linear(hidden, ffn, bias=False, **options),
        te.ops.SwiGLU(),
        te.ops.Linear(ffn // 2, hidden, bias=False, **options),
    )
    # The peers' initialization (mlp_peers.make_arg_set), so the outputs are comparable.
    with torch.no_grad():
        norm, fc1, _, fc2 = block
        norm.weight.copy_(1 + 0.1 * torch.randn(hidden, **options))
        norm.bias.copy_(0.1 * torch.randn(hidden, **options))
        fc1.weight.copy_(torch.randn(ffn, hidden, **options) * hidden**-0.5)
        fc2.weight.copy_(torch.randn(hidden, ffn // 2, **options) * (ffn // 2) ** -0.5)
    return block


def eager_forward(block, x):
    """The same block in plain PyTorch with TE's weights: the reference of rel_err_vs_eager."""
    norm, fc1, _, fc2 = block
    h = F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, eps=1e-5)
    gate, value = F.linear(h, fc1.weight).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * value, fc2.weight)


def make_call(te, block, fp8_recipe, mode):
    parameters = list(block.parameters())

    def forward(x, grad):
        del grad
        with torch.no_grad(), autocast(te, fp8_recipe):
            return block(x)

    def forward_train(x, grad):
        del grad
        with autocast(te, fp8_recipe):
            return block(x)

    def forward_backward(x, grad):
        with autocast(te, fp8_recipe):
            y = block(x)
        return torch.autograd.grad(y, [x, *parameters], grad_outputs=grad)

    return {"fwd": forward, "fwd_train": forward_train, "fwdbwd": forward_backward}[mode]


def rotation_sets(size, mode, seed):
    common.seed_everything(seed)
    shape = (size["tokens"], size["hidden"])
    options = {"device": common.DEVICE, "dtype": torch.bfloat16}
    count = common.rotation_count(2 * 2 * shape[0] * shape[1])
    return [
        [torch.randn(*shape, **options).requires_grad_(mode != "fwd"), torch.randn(*shape, **options)]
        for _ in range(count)
    ]


def gemm_flops(size, mode):
    tokens, hidden, ffn = size["tokens"], size["hidden"], size["ffn"]
    forward = 2 * tokens * ffn * hidden + 2 * tokens * hidden * (ffn // 2)
    return 3 * forward if mode == "fwdbwd" else forward


def measure(te, recipe, variant, size_name, mode, args):
    size = common.MLP_SIZES[size_name]
    fp8_recipe, unavailable = make_recipe(te, recipe, variant)
    key = {"size": size_name, **size, "mode": mode, "variant": variant}
    if unavailable:
        return {**key, "skipped": unavailable}
    common.seed_everything(args.seed)
    block = build_block(te, size)  # fresh weights and quantizer state per measurement
    sets = rotation_sets(size, mode, args.seed + 1)
    call = make_call(te, block, fp8_recipe, mode)
    began = time.perf_counter()
    with torch.no_grad(), autocast(te, fp8_recipe):
        y = block(sets[0][0])
        error = common.relative_error(y, eager_forward(block, sets[0][0]))
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - began
    large = size_name == "large"
    timing = common.time_device(call, sets, min_iters=50 if large else 200, max_iters=2000,
                                target_seconds=args.target_seconds)
    host_us = None
    if size_name in args.host_time_sizes:
        host_us = common.time_host(call, sets, iters=args.host_iters)
    flops = gemm_flops(size, mode)
    return {
        **key,
        **timing,
        "tflops": flops / (timing["median_ms"] * 1e-3) / 1e12,
        "gemm_flops": flops,
        "host_us": host_us,
        "first_call_s": first_call_s,
        "rel_err_vs_eager": error,
    }


COLUMNS = [
    ("size", "size", ""),
    ("mode", "mode", ""),
    ("variant", "variant", ""),
    ("ms", "median_ms", ".4f"),
    ("TFLOP/s", "tflops", ".1f"),
    ("gpu ms", "gpu_median_ms", ".4f"),
    ("host us", "host_us", ".1f"),
    ("iters", "iters", "d"),
    ("rel err", "rel_err_vs_eager", ".1e"),
]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here (rewritten after every measurement)")
    parser.add_argument("--sizes", default="large,medium,tiny", help="comma list, in this order")
    parser.add_argument("--modes", default="fwd,fwdbwd", help=",".join(MODES))
    parser.add_argument("--variants", default=",".join(VARIANTS), help=",".join(VARIANTS))
    parser.add_argument("--host-time-sizes", default="tiny", help="sizes with host time per call")
    parser.add_argument("--host-iters", type=int, default=1000)
    parser.add_argument("--target-seconds", type=float, default=0.5,
                        help="timed span per measurement")
    parser.add_argument("--budget-seconds", type=float, default=0.0,
                        help="stop starting measurements after this much wall time (0: none)")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    args.sizes = list(dict.fromkeys(common.parse_list(args.sizes, common.SIZE_ORDER, "sizes")))
    args.modes = common.parse_list(args.modes, MODES, "modes")
    args.variants = common.parse_list(args.variants, VARIANTS, "variants")
    args.host_time_sizes = common.parse_list(args.host_time_sizes, common.SIZE_ORDER, "sizes")
    return args


def main(argv):
    args = parse_args(argv)
    common.require_cuda()
    transformer_engine, te, recipe = import_te()
    common.print_banner("te_peers")
    print(f"Transformer Engine {transformer_engine.__version__}", flush=True)
    report = common.JsonReport(args.json, "te_peers", dict(vars(args)))
    report.data["transformer_engine"] = transformer_engine.__version__
    started = time.perf_counter()
    rows = []
    for size_name in args.sizes:
        for mode in args.modes:
            for variant in args.variants:
                key = {"size": size_name, "mode": mode, "variant": variant}
                if args.budget_seconds and time.perf_counter() - started > args.budget_seconds:
                    report.add({**key, "skipped": "time budget"})
                    continue
                try:
                    row = measure(te, recipe, variant, size_name, mode, args)
                except Exception as error:  # one failing variant must not cost the others
                    message = common.error_line(error)
                    print(f"FAILED {size_name} {mode} {variant}: {message}", flush=True)
                    report.add({**key, "error": message})
                    continue
                finally:
                    torch.cuda.empty_cache()
                report.add(row)
                if "skipped" in row:
                    print(f"skip {size_name} {mode} {variant}: {row['skipped']}", flush=True)
                    continue
                rows.append(row)
                print(common.format_table(COLUMNS, [row]).splitlines()[-1], flush=True)
    print()
    print(common.format_table(COLUMNS, rows))
    print(f"(total {time.perf_counter() - started:.0f} s)")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
