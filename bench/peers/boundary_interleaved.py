#!/usr/bin/env python3
"""The seed MLP split in two sequences with an FP8 boundary against the same MLP in one sequence.

Issue 24: dsl_examples/mlp_residual.fuse passes h between fc1 and fc2 in FP8 (fc1's SwiGLU kernel
writes the copies fc2's GEMMs read; fc2 casts nothing), so the two-sequence MLP should run as fast
as the one-sequence MLP with the same ops. Three programs, FP8 delayed scaling, one process, the
same stream, through the Python package (docs/python.md):

  whole       one sequence: layernorm, up_proj, swiglu, down_proj, + residual (x given twice)
  split_fp8   mlp_residual.fuse: fc1 -> h (e4m3, row-wise and column-wise copies) -> fc2
  split_bf16  the same split with h in bf16 (fc2 casts h again: what passing bf16 costs)

`with fp8_weights` is dropped from mlp_residual.fuse so that all three cast the weights alike.
--mode fwdbwd times training steps (forward, backward, step of every sequence), --mode fwd
inference forwards. Each pair (whole, split_*) runs interleaved (gemm_interleaved.
interleaved_rounds: alternating calls behind a sleep kernel, the first side switching per round);
the result is the median over rounds of split / whole, with the rounds' min and max.

  python3 bench/peers/boundary_interleaved.py --tokens 16384 --mode fwdbwd
"""

import argparse
import json
import os
import statistics
import sys

import torch

from gemm_interleaved import interleaved_rounds

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WHOLE = """
const hidden = 4096
const ffn = 28672
recipe fp8 = delayed_scaling(format = hybrid, amax_history = 1024)
sequence mlp(x: bf16[tokens, hidden], residual: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden])
    uses fp8 {
  layernorm(hidden, eps = 1e-5)
  linear(hidden, ffn, bias = false) as up_proj
  swiglu()
  linear(ffn / 2, hidden, bias = false) as down_proj
  add_extra_input(residual)
}
"""


def split_source(fp8_boundary):
    with open(os.path.join(SOURCE_DIR, "dsl_examples", "mlp_residual.fuse")) as f:
        text = f.read().replace(" with fp8_weights", "")
    if not fp8_boundary:
        text = text.replace("e4m3[tokens, ffn / 2] quantized(rowwise, columnwise)",
                            "bf16[tokens, ffn / 2]")
        text = text.replace("  quantize()", "  # quantize()")
    return text


class Whole:
    def __init__(self, opfuse, tokens, stream):
        program = opfuse.compile(WHOLE, name="whole.fuse")
        self.s = program.session("mlp", device="cuda", stream=stream, tokens=tokens)
        self.s.own_parameters(1, stream)
        self.stream = stream
        self.inference = opfuse.RunMode.INFERENCE

    def run(self, x, dy, training):
        s = self.s
        s.set_tensor("x", x)
        s.set_tensor("residual", x)
        if training:
            s.forward(self.stream)
            s.set_tensor("dy", dy)
            s.backward(self.stream)
            s.step(self.stream)
        else:
            s.forward(self.stream, mode=self.inference)


class Split:
    def __init__(self, opfuse, tokens, stream, fp8_boundary):
        program = opfuse.compile(split_source(fp8_boundary), name="mlp_residual.fuse")
        self.fc1 = program.session("fc1", device="cuda", stream=stream, tokens=tokens)
        self.fc2 = program.session("fc2", device="cuda", stream=stream, tokens=tokens)
        self.fc1.own_parameters(1, stream)
        self.fc2.own_parameters(2, stream)
        self.fp8 = fp8_boundary
        self.stream = stream
        self.inference = opfuse.RunMode.INFERENCE

    def run(self, x, dy, training):
        fc1, fc2, st = self.fc1, self.fc2, self.stream
        fc1.set_tensor("x", x)
        if training:
            fc1.forward(st)
        else:
            fc1.forward(st, mode=self.inference)
        if self.fp8:
            fc2.set_quantized("h", **fc1.quantized_output("h"))
        else:
            fc2.set_tensor("h", fc1.output("h"))
        fc2.set_tensor("residual", fc1.output("residual"))
        if not training:
            fc2.forward(st, mode=self.inference)
            return
        fc2.forward(st)
        fc2.set_tensor("dy", dy)
        fc2.backward(st)
        fc1.set_tensor("dh", fc2.input_grad("h"))
        fc1.set_tensor("dresidual", fc2.input_grad("residual"))
        fc1.backward(st)
        fc1.step(st)
        fc2.step(st)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--mode", choices=["fwd", "fwdbwd"], default="fwdbwd")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    import opfuse

    stream = torch.cuda.current_stream().cuda_stream
    training = args.mode == "fwdbwd"
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = [(torch.randn(args.tokens, 4096, device="cuda", generator=gen).bfloat16(),
             (torch.randn(args.tokens, 4096, device="cuda", generator=gen) * 1e-3).bfloat16())
            for _ in range(2)]
    whole = Whole(opfuse, args.tokens, stream)
    results = {"tokens": args.tokens, "mode": args.mode, "device": torch.cuda.get_device_name(),
               "pairs": {}}
    for name, fp8 in (("split_fp8", True), ("split_bf16", False)):
        split = Split(opfuse, args.tokens, stream, fp8)
        sides = {name: lambda x, dy, s=split: s.run(x, dy, training),
                 "whole": lambda x, dy: whole.run(x, dy, training)}
        per_round, ratios = interleaved_rounds(sides, sets, args.rounds, args.iters)
        row = {"split_ms": statistics.median(per_round[name]),
               "whole_ms": statistics.median(per_round["whole"]),
               "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
               "ratio_max": max(ratios)}
        results["pairs"][name] = row
        print(f"{args.mode} tokens {args.tokens}: {name} {row['split_ms']:.3f} ms, whole "
              f"{row['whole_ms']:.3f} ms, {name} / whole median {row['ratio_median']:.4f} "
              f"[{row['ratio_min']:.4f}, {row['ratio_max']:.4f}]", flush=True)
        del split
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
