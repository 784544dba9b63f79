#!/usr/bin/env python3
"""The seed MLP block (dsl_examples/mlp.fuse) in PyTorch: the peers opfuse is measured against.

LayerNorm(hidden, eps 1e-5, with bias) -> Linear(hidden -> ffn, no bias) -> SwiGLU (first half is
the gate: silu(a) * b) -> Linear(ffn / 2 -> hidden, no bias), bf16 parameters and input.

Variants: eager bf16; torch.compile bf16 (default mode, and max-autotune-no-cudagraphs where time
allows); torch.compile with FP8 GEMMs through torch._scaled_mm under current scaling (per-tensor
amax, scale = fp8_max / amax, activations and weights cast on every call, E4M3 forward, E5M2
gradients in the backward, output bf16).

Modes: fwd (no autograd) and fwdbwd (forward, then the backward of sum(y * grad) for a fixed random
grad: gradients of the input and every parameter, no optimizer step).
"""

import argparse
import sys
import time

import torch
import torch._dynamo
import torch.nn.functional as F

import peer_common as common

VARIANTS = ["eager", "compile", "compile_fp8", "compile_autotune", "eager_fp8"]
DEFAULT_VARIANTS = ["eager", "compile", "compile_fp8", "compile_autotune"]
MODES = ["fwd", "fwdbwd"]
# Variants that are run only while the time budget allows (decided by measured compile times).
OPTIONAL_VARIANTS = {"compile_autotune"}


def mlp_bf16(x, ln_weight, ln_bias, fc1_weight, fc2_weight):
    h = F.layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, eps=1e-5)
    h = F.linear(h, fc1_weight)
    gate, value = h.chunk(2, dim=-1)
    return F.linear(F.silu(gate) * value, fc2_weight)


def quantize_current(tensor, dtype, fp8_max):
    """Current scaling: one amax over the tensor, scale = fp8_max / amax (1 when amax is 0 or not
    finite). Returns the FP8 tensor and the inverse scale that _scaled_mm takes."""
    amax = tensor.abs().amax().float()
    usable = torch.isfinite(amax) & (amax > 0)
    scale = torch.where(usable, fp8_max / amax, torch.ones_like(amax))
    quantized = (tensor.float() * scale).clamp(-fp8_max, fp8_max).to(dtype)
    return quantized, scale.reciprocal()


def fp8_gemm(a, a_scale_inv, b, b_scale_inv, fast_accum):
    # _scaled_mm wants `a` row-major and `b` column-major: the TN layout of cuBLASLt FP8.
    return torch._scaled_mm(
        a,
        b,
        scale_a=a_scale_inv,
        scale_b=b_scale_inv,
        out_dtype=torch.bfloat16,
        use_fast_accum=fast_accum,
    )


def column_major(tensor):
    """The same matrix stored column-major (a transposed copy, as TE's cast-transpose makes)."""
    return tensor.t().contiguous().t()


class Fp8Linear(torch.autograd.Function):
    """y = x @ w.t() with FP8 operands; the backward follows TE's defaults: E5M2 gradients and
    split (not fast) accumulation for dgrad and wgrad."""

    @staticmethod
    def forward(ctx, inp, weight):
        inp_fp8, inp_scale_inv = quantize_current(inp, torch.float8_e4m3fn, common.E4M3_MAX)
        weight_fp8, weight_scale_inv = quantize_current(
            weight, torch.float8_e4m3fn, common.E4M3_MAX
        )
        ctx.save_for_backward(inp_fp8, inp_scale_inv, weight_fp8, weight_scale_inv)
        return fp8_gemm(inp_fp8, inp_scale_inv, weight_fp8.t(), weight_scale_inv, True)

    @staticmethod
    def backward(ctx, grad_out):
        inp_fp8, inp_scale_inv, weight_fp8, weight_scale_inv = ctx.saved_tensors
        grad_fp8, grad_scale_inv = quantize_current(
            grad_out.contiguous(), torch.float8_e5m2, common.E5M2_MAX
        )
        # dgrad: [tokens, out] @ [out, in]; wgrad: [out, tokens] @ [tokens, in].
        grad_inp = fp8_gemm(
            grad_fp8, grad_scale_inv, column_major(weight_fp8), weight_scale_inv, False
        )
        grad_weight = fp8_gemm(
            grad_fp8.t().contiguous(), grad_scale_inv, column_major(inp_fp8), inp_scale_inv, False
        )
        return grad_inp, grad_weight


def mlp_fp8(x, ln_weight, ln_bias, fc1_weight, fc2_weight):
    h = F.layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, eps=1e-5)
    h = Fp8Linear.apply(h, fc1_weight)
    gate, value = h.chunk(2, dim=-1)
    return Fp8Linear.apply(F.silu(gate) * value, fc2_weight)


def build_callable(variant):
    """The function a variant runs; compiled variants start from a fresh dynamo state."""
    if variant == "eager":
        return mlp_bf16
    if variant == "eager_fp8":
        return mlp_fp8
    torch._dynamo.reset()
    if variant == "compile":
        return torch.compile(mlp_bf16, dynamic=False)
    if variant == "compile_autotune":
        return torch.compile(mlp_bf16, dynamic=False, mode="max-autotune-no-cudagraphs")
    if variant == "compile_fp8":
        return torch.compile(mlp_fp8, dynamic=False)
    raise ValueError(variant)


def make_arg_set(size, requires_grad):
    tokens, hidden, ffn = size["tokens"], size["hidden"], size["ffn"]
    options = {"device": common.DEVICE, "dtype": torch.bfloat16}
    x = torch.randn(tokens, hidden, **options)
    ln_weight = 1 + 0.1 * torch.randn(hidden, **options)
    ln_bias = 0.1 * torch.randn(hidden, **options)
    fc1_weight = torch.randn(ffn, hidden, **options) * hidden**-0.5
    fc2_weight = torch.randn(hidden, ffn // 2, **options) * (ffn // 2) ** -0.5
    inputs = [x, ln_weight, ln_bias, fc1_weight, fc2_weight]
    for tensor in inputs:
        tensor.requires_grad_(requires_grad)
    grad = torch.randn(tokens, hidden, **options)
    return inputs, grad


def gemm_flops(size, mode):
    tokens, hidden, ffn = size["tokens"], size["hidden"], size["ffn"]
    forward = 2 * tokens * ffn * hidden + 2 * tokens * hidden * (ffn // 2)
    return forward if mode == "fwd" else 3 * forward


def make_call(fn, mode):
    """One timed call: the forward alone under no_grad, or the forward then the backward of
    sum(y * grad)."""
    if mode == "fwd":

        def forward(*args):
            with torch.no_grad():
                return fn(*args[:-1])

        return forward

    def forward_backward(*args):
        inputs, grad = args[:-1], args[-1]
        y = fn(*inputs)
        return torch.autograd.grad(y, inputs, grad_outputs=grad)

    return forward_backward


def outputs_of(call, args):
    result = call(*args)
    return [result] if isinstance(result, torch.Tensor) else list(result)


def reference_outputs(mode, args_of_call):
    """Eager bf16's outputs on the first set: each variant's relative error is against them."""
    return [t.detach().clone() for t in outputs_of(make_call(mlp_bf16, mode), args_of_call)]


def measure(variant, size_name, mode, sets, set_bytes, reference, args):
    size = common.MLP_SIZES[size_name]
    torch._dynamo.utils.counters.clear()
    call = make_call(build_callable(variant), mode)

    # The first call of a compiled variant compiles it: time it on its own, outside the timed runs.
    began = time.perf_counter()
    first = outputs_of(call, sets[0])
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - began
    if len(sets) > 1:
        outputs_of(call, sets[1])  # a second set must not recompile: same shapes and strides
    error = max(common.relative_error(v, r) for v, r in zip(first, reference, strict=True))
    # A graph break splits a compiled variant into pieces with eager code between them.
    graph_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    del first

    large = size_name == "large"
    timing = common.time_device(
        call,
        sets,
        min_iters=50 if large else 200,
        max_iters=2000,
        target_seconds=args.target_seconds,
    )
    host_us = None
    if size_name in args.host_time_sizes:
        host_us = common.time_host(call, sets, iters=args.host_iters)
    extra = common.peak_memory_bytes(call, sets[0])
    flops = gemm_flops(size, mode)
    return {
        "size": size_name,
        **size,
        "mode": mode,
        "variant": variant,
        **timing,
        "tflops": flops / (timing["median_ms"] * 1e-3) / 1e12,
        "gemm_flops": flops,
        "host_us": host_us,
        "first_call_s": first_call_s,
        "peak_mb": (extra + set_bytes) / 2**20,
        "rel_err_vs_eager": error,
        "graph_breaks": graph_breaks,
    }


COLUMNS = [
    ("size", "size", ""),
    ("mode", "mode", ""),
    ("variant", "variant", ""),
    ("ms", "median_ms", ".4f"),
    ("TFLOP/s", "tflops", ".1f"),
    ("gpu ms", "gpu_median_ms", ".4f"),
    ("gap us", "gpu_gap_us", ".1f"),
    ("host us", "host_us", ".1f"),
    ("peak MiB", "peak_mb", ".0f"),
    ("1st call s", "first_call_s", ".1f"),
    ("iters", "iters", "d"),
    ("sets", "rotation_sets", "d"),
    ("rel err", "rel_err_vs_eager", ".1e"),
    ("breaks", "graph_breaks", "d"),
]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here (rewritten after every measurement)")
    parser.add_argument(
        "--sizes",
        default="tiny,medium,large",
        help="comma list of tiny,medium,large, measured in the given order",
    )
    parser.add_argument("--modes", default="fwd,fwdbwd", help="comma list of fwd,fwdbwd")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=",".join(VARIANTS))
    parser.add_argument(
        "--autotune-sizes",
        default="tiny,medium,large",
        help="sizes at which compile_autotune may run (also skipped when the budget is short)",
    )
    parser.add_argument("--host-time-sizes", default="tiny", help="sizes with host time per call")
    parser.add_argument("--host-iters", type=int, default=2000)
    parser.add_argument(
        "--target-seconds", type=float, default=0.5, help="timed span per measurement"
    )
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=0.0,
        help="wall time this script may take (0: unbounded); optional variants are skipped when "
        "the remaining time is under twice the longest compile they have taken so far",
    )
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    # The given order is kept: a run under a time limit can measure the size that matters first.
    args.sizes = list(dict.fromkeys(common.parse_list(args.sizes, common.SIZE_ORDER, "sizes")))
    args.modes = common.parse_list(args.modes, MODES, "modes")
    args.variants = common.parse_list(args.variants, VARIANTS, "variants")
    args.autotune_sizes = common.parse_list(args.autotune_sizes, common.SIZE_ORDER, "sizes")
    args.host_time_sizes = common.parse_list(args.host_time_sizes, common.SIZE_ORDER, "sizes")
    return args


def optional_variant_fits(args, started, longest_compile_s):
    if args.budget_seconds <= 0:
        return True
    remaining = args.budget_seconds - (time.perf_counter() - started)
    # Before any autotuned compile has been seen, assume a minute: that is what a cold one takes.
    return remaining > 2 * max(longest_compile_s, 60.0)


def make_rotation_sets(size, mode, seed):
    """Enough argument sets (inputs, parameters, grad) that cycling them misses the L2."""
    common.seed_everything(seed)
    one_set, grad = make_arg_set(size, requires_grad=False)
    count = common.rotation_count(common.tensor_bytes([*one_set, grad]))
    del one_set, grad
    sets = []
    for _ in range(count):
        inputs, grad = make_arg_set(size, requires_grad=(mode == "fwdbwd"))
        sets.append([*inputs, grad])
    return sets


def run_size_mode(size_name, mode, variants, args, report, rows, started, state):
    sets = make_rotation_sets(common.MLP_SIZES[size_name], mode, args.seed)
    # Peak memory counts one set's inputs and parameters (the grad only where it is used).
    set_bytes = common.tensor_bytes(sets[0] if mode == "fwdbwd" else sets[0][:-1])
    reference = reference_outputs(mode, sets[0])
    for variant in variants:
        if variant == "compile_autotune" and size_name not in args.autotune_sizes:
            continue
        key = {"size": size_name, "mode": mode, "variant": variant}
        if variant in OPTIONAL_VARIANTS and not optional_variant_fits(
            args, started, state["longest_autotune_s"]
        ):
            print(f"skip {size_name} {mode} {variant}: time budget", flush=True)
            report.add({**key, "skipped": "time budget"})
            continue
        try:
            row = measure(variant, size_name, mode, sets, set_bytes, reference, args)
        except Exception as error:  # one broken variant must not cost the whole run
            message = common.error_line(error)
            print(f"FAILED {size_name} {mode} {variant}: {message}", flush=True)
            report.add({**key, "error": message})
            continue
        if variant == "compile_autotune":
            state["longest_autotune_s"] = max(state["longest_autotune_s"], row["first_call_s"])
        rows.append(row)
        report.add(row)
        print(common.format_table(COLUMNS, [row]).splitlines()[-1], flush=True)
    del sets, reference
    torch.cuda.empty_cache()


def main(argv):
    args = parse_args(argv)
    common.require_cuda()
    common.print_banner("mlp_peers")
    # Compiled variants are rebuilt per size, mode and variant; the default limit of cached
    # recompilations would otherwise fall back to eager without saying so in the numbers.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    report = common.JsonReport(args.json, "mlp_peers", dict(vars(args)))
    started = time.perf_counter()
    state = {"longest_autotune_s": 0.0}
    rows = []
    # Required variants first at every size; then the optional (slow to compile) ones, largest
    # size first since that is the comparison that matters, while the budget lasts.
    required = [v for v in args.variants if v not in OPTIONAL_VARIANTS]
    optional = [v for v in args.variants if v in OPTIONAL_VARIANTS]
    largest_first = sorted(args.sizes, key=common.SIZE_ORDER.index, reverse=True)
    for variants, sizes in ((required, args.sizes), (optional, largest_first)):
        if not variants:
            continue
        for size_name in sizes:
            for mode in args.modes:
                run_size_mode(size_name, mode, variants, args, report, rows, started, state)
    order = {name: i for i, name in enumerate(common.SIZE_ORDER + MODES + VARIANTS)}
    rows.sort(key=lambda row: (order[row["size"]], order[row["mode"]], order[row["variant"]]))
    print()
    print(common.format_table(COLUMNS, rows))
    print(
        f"(first call of a compiled variant includes torch.compile; "
        f"total {time.perf_counter() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
