#!/usr/bin/env python3
"""Which GEMM kernels Transformer Engine and opfuse run in the seed MLP's training step (issue 22).

TE's GEMMs were faster than opfuse's in the large FP8 step (issue 22: 12.03 ms against 12.74 ms
for the six). This script shows which kernels each side's cuBLASLt calls picked and how long each
took inside a real step, in one process and one profile: TE's block (te_peers.build_block,
te.ops.Sequential LayerNorm -> Linear -> SwiGLU -> Linear) and opfuse's Session over
bench/workloads/mlp_SIZE.fuse (through the Python package, docs/python.md), both under the same
recipe on the same parameters, input and output gradient (mlp_peers.make_arg_set's), `--steps`
training steps each (forward, backward and the quantizer update) after `--warmup` untimed ones,
under torch.profiler (CUPTI records every kernel of the process, opfuse's cuBLASLt calls
included), in `--rounds` rounds whose side order rotates (the side that runs later finds the GPU warmer,
and a power-capped GPU then clocks lower). `--sides te,opfuse,opfuse_own` adds opfuse on the
parameters its own_parameters draws (`fusec bench`'s) beside it. Per side it prints the GEMM kernels of one step in launch order with
their mean device time over the profiled steps, and the sum; the time per step the GPU ran no
kernel while the steps were queued back to back (issue 22's time between steps), with the largest
gaps; then every kernel name only one side ran, so a GEMM whose kernel differs stands out. `--clock-steps N` runs N more steps per side
under nvidia-smi sampling and prints the SM clock and power the step ran at.

  TE_KIT=... bench/peers/te_env.sh install && source bench/peers/te_env.sh
  python3 bench/peers/gemm_kernels.py [--size large] [--recipe fp8_delayed] [--json OUT]

A kernel counts as a GEMM when its name has one of GEMM_MARKERS (cuBLASLt's nvjet and xmma
kernels, CUTLASS's).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import torch

import peer_common as common

GEMM_MARKERS = ("nvjet", "gemm", "xmma", "cutlass", "sm90_")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# The .fuse recipe names (bench/workloads/mlp_*.fuse) and TE's variants of them (te_peers.py).
TE_VARIANTS = {"fp8_delayed": "te_fp8_delayed", "fp8_current": "te_fp8_current",
               "fp8_block": "te_fp8_block", "bf16": "te_bf16"}


def is_gemm(name):
    lowered = name.lower()
    return any(marker in lowered for marker in GEMM_MARKERS)


def profile_kernels(step, warmup, steps):
    """(name, start us, end us) of every kernel of `steps` calls of step(), in launch order."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: e.time_range.start)
    return [(e.name, e.time_range.start, e.time_range.end) for e in kernels]


def idle_time(kernels, steps, largest=6):
    """Where the GPU did nothing while the steps were queued back to back: the span from the
    first kernel's start to the last one's end, the time some kernel ran (overlaps counted
    once), their difference per step, and the largest gaps with the kernels on either side."""
    busy = 0.0
    covered_to = None
    gaps = []
    previous = None
    for name, start, end in kernels:
        if covered_to is None or start >= covered_to:
            if covered_to is not None:
                gaps.append((start - covered_to, previous, name))
            busy += end - start
            covered_to = end
        elif end > covered_to:
            busy += end - covered_to
            covered_to = end
        previous = name
    span = kernels[-1][2] - kernels[0][1] if kernels else 0.0
    gaps.sort(key=lambda g: -g[0])
    return {"span_ms_per_step": span / steps / 1e3, "busy_ms_per_step": busy / steps / 1e3,
            "idle_ms_per_step": (span - busy) / steps / 1e3,
            "gaps": len(gaps), "kernels_per_step": len(kernels) / steps,
            "largest_gaps": [{"us": round(us, 1), "after": a, "before": b}
                             for us, a, b in gaps[:largest]]}


class ClockSampler:
    """nvidia-smi sampling the SM clock (MHz) and power (W) of GPU 0 every 20 ms while open: what
    clock the power cap leaves each side's step. Empty when nvidia-smi is missing."""

    def __enter__(self):
        command = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                   "-i", "0", "-lms", "20"]
        try:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        except OSError:
            self.process = None
        self.samples = []
        return self

    def __exit__(self, *exc):
        if self.process is None:
            return False
        self.process.terminate()
        out, _ = self.process.communicate()
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((float(parts[0]), float(parts[1])))
            except (ValueError, IndexError):
                continue
        return False

    def summary(self):
        if not self.samples:
            return {}
        clocks = sorted(c for c, _ in self.samples)
        power = sorted(p for _, p in self.samples)
        return {"samples": len(self.samples), "sm_mhz_median": statistics.median(clocks),
                "sm_mhz_p10": clocks[len(clocks) // 10], "sm_mhz_p90": clocks[9 * len(clocks) // 10],
                "power_w_median": statistics.median(power)}


def clocks_under(step, steps):
    """The SM clock and power while `steps` more steps run back to back."""
    torch.cuda.synchronize()
    with ClockSampler() as sampler:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return sampler.summary()


def gemm_table(kernels, steps):
    """The GEMMs of one step in launch order: (position, name, mean us, min us) over the steps.
    Refuses a profile whose steps ran different GEMM sequences."""
    gemms = [(name, end - start) for name, start, end in kernels if is_gemm(name)]
    if steps < 1 or len(gemms) % steps != 0:
        raise SystemExit(f"gemm_kernels: {len(gemms)} GEMM kernels in {steps} steps")
    per_step = len(gemms) // steps
    rows = []
    for position in range(per_step):
        runs = gemms[position::per_step]
        names = {name for name, _ in runs}
        if len(names) != 1:
            raise SystemExit(f"gemm_kernels: GEMM {position} ran different kernels: {names}")
        times = [us for _, us in runs]
        rows.append({"position": position, "kernel": runs[0][0],
                     "mean_us": statistics.mean(times), "min_us": min(times)})
    return rows


def shared_tensors(size, seed):
    """The parameters, input and output gradient both sides train on (mlp_peers.make_arg_set's
    initialization, as te_peers.build_block's): same values, so the FP8 operands' bits match too."""
    from mlp_peers import make_arg_set

    common.seed_everything(seed)
    (x, ln_weight, ln_bias, fc1_weight, fc2_weight), grad = make_arg_set(size, requires_grad=False)
    return {"x": x, "grad": grad, "layernorm_0.weight": ln_weight, "layernorm_0.bias": ln_bias,
            "fc1.weight": fc1_weight, "fc2.weight": fc2_weight}


def te_step(size, recipe_name, tensors):
    """One training step of TE's block (forward under TE's autocast, backward)."""
    import te_peers

    _, te, recipe = te_peers.import_te()
    fp8_recipe, why_not = te_peers.make_recipe(te, recipe, TE_VARIANTS[recipe_name])
    if why_not:
        raise SystemExit(f"gemm_kernels: TE cannot run {recipe_name} here: {why_not}")
    block = te_peers.build_block(te, size)
    norm, fc1, _, fc2 = block
    with torch.no_grad():
        for mine, name in ((norm.weight, "layernorm_0.weight"), (norm.bias, "layernorm_0.bias"),
                           (fc1.weight, "fc1.weight"), (fc2.weight, "fc2.weight")):
            mine.copy_(tensors[name])
    x = tensors["x"].clone().requires_grad_(True)
    grad = tensors["grad"]

    def step():
        with te_peers.autocast(te, fp8_recipe):
            y = block(x)
        y.backward(grad)

    step.keep = (block, x)
    return step


def opfuse_step(size_name, size, recipe_name, tensors, seed, own=False):
    """One training step of opfuse's Session (forward, backward, step) on torch's stream; `own`:
    on the parameters Session.own_parameters(seed) draws (fusec bench's), not the shared ones."""
    import opfuse

    program = opfuse.compile(os.path.join(ROOT, "bench", "workloads", f"mlp_{size_name}.fuse"),
                             recipe=recipe_name)
    stream = torch.cuda.current_stream().cuda_stream
    session = program.session(device="cuda", stream=stream, tokens=size["tokens"])
    session.own_parameters(seed, stream)
    if not own:
        for name in ("layernorm_0.weight", "layernorm_0.bias", "fc1.weight", "fc2.weight"):
            session.set_tensor(name, tensors[name])
    session.set_tensor("x", tensors["x"])
    session.set_tensor("dy", tensors["grad"])

    def step():
        session.forward(stream)
        session.backward(stream)
        session.step(stream)

    step.keep = (session, tensors)  # alive as long as the step
    return step


def print_side(label, rows):
    print(f"\n{label}: {len(rows)} GEMMs per step, {sum(r['mean_us'] for r in rows) / 1e3:.3f} ms")
    for r in rows:
        print(f"  {r['position']:2d}  {r['mean_us'] / 1e3:7.3f} ms (min {r['min_us'] / 1e3:.3f})"
              f"  {r['kernel']}")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="large", choices=["medium", "large"])
    parser.add_argument("--recipe", default="fp8_delayed", choices=sorted(TE_VARIANTS))
    parser.add_argument("--sides", default="te,opfuse",
                        help="comma list of te, opfuse and opfuse_own (opfuse on the parameters "
                        "own_parameters draws, as fusec bench runs it)")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps per side")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    parser.add_argument("--rounds", type=int, default=2,
                        help="profiles per side, the side order rotating between rounds")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--clock-steps", type=int, default=0,
                        help="also this many steps per side under nvidia-smi sampling (SM clock, "
                        "power); 0: none")
    parser.add_argument("--json", help="write the tables here")
    args = parser.parse_args(argv)
    args.sides = common.parse_list(args.sides, ["te", "opfuse", "opfuse_own"], "sides")
    return args


def report_side(label, kernels, steps, step, clock_steps, result, side):
    rows = gemm_table(kernels, steps)
    print_side(label, rows)
    idle = idle_time(kernels, steps)
    print(f"  per step: span {idle['span_ms_per_step']:.3f} ms, kernels busy "
          f"{idle['busy_ms_per_step']:.3f} ms, idle {idle['idle_ms_per_step']:.3f} ms in "
          f"{idle['gaps']} gaps ({idle['kernels_per_step']:.0f} kernels per step)")
    for gap in idle["largest_gaps"]:
        print(f"    gap {gap['us']:8.1f} us after {gap['after'][:70]} before {gap['before'][:70]}")
    entry = {"gemms": rows, "idle": idle}
    if clock_steps > 0:
        entry["clocks"] = clocks_under(step, clock_steps)
        print(f"  clocks over {clock_steps} more steps: {entry['clocks']}")
    result["rounds"][-1][side] = entry
    return rows


def main(argv):
    args = parse_args(argv)
    common.require_cuda()
    common.print_banner("gemm_kernels")
    size = common.MLP_SIZES[args.size]
    result = {"size": args.size, "recipe": args.recipe, "steps": args.steps, "rounds": []}
    # Both sides on the same parameters, input and output gradient; both built first, then
    # profiled in rounds whose side order rotates, so neither side always runs on the GPU
    # the other one warmed.
    tensors = shared_tensors(size, args.seed)
    steps = {}
    for side in args.sides:
        if side == "te":
            steps[side] = te_step(size, args.recipe, tensors)
        else:
            steps[side] = opfuse_step(args.size, size, args.recipe, tensors, args.seed,
                                      own=side == "opfuse_own")
        for _ in range(args.warmup):
            steps[side]()
    sums = {side: [] for side in args.sides}
    names = {side: set() for side in args.sides}
    for r in range(args.rounds):
        result["rounds"].append({})
        order = args.sides[r % len(args.sides):] + args.sides[:r % len(args.sides)]
        for side in order:
            kernels = profile_kernels(steps[side], 1, args.steps)
            label = f"round {r + 1}: {side} {args.size} {args.recipe}"
            rows = report_side(label, kernels, args.steps, steps[side], args.clock_steps,
                               result, side)
            sums[side].append(sum(row["mean_us"] for row in rows) / 1e3)
            names[side] |= {row["kernel"] for row in rows}
    print("\nGEMM ms per step, by round: " + "; ".join(
        f"{side} {', '.join(f'{ms:.3f}' for ms in sums[side])}" for side in args.sides))
    if "te" in names:
        for side in (s for s in args.sides if s != "te"):
            te_only, side_only = names["te"] - names[side], names[side] - names["te"]
            print(f"kernels TE and {side} both ran: {len(names['te'] & names[side])}; TE only: "
                  f"{sorted(te_only)}; {side} only: {sorted(side_only)}")
            ratios = [o / t for o, t in zip(sums[side], sums["te"], strict=True)]
            print(f"{side} / TE GEMM time per round: {', '.join(f'{x:.3f}' for x in ratios)}")
            result.setdefault("ratios", {})[side] = ratios
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
