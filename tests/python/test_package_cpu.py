"""The installed `opfuse` package on the CPU (no GPU, no torch): NumPy arrays through the CPU
reference against `fusec run --device cpu`, diagnostics and misuse as the right exceptions.

Run by tests/python/run_package_tests.sh (ctest: python_package) with FUSEC (the fusec binary)
and OPFUSE_SOURCE_DIR in the environment.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import unittest

import numpy as np

import opfuse

SOURCE_DIR = os.environ["OPFUSE_SOURCE_DIR"]
FUSEC = os.environ["FUSEC"]
MLP = os.path.join(SOURCE_DIR, "dsl_examples", "mlp.fuse")

# A small block (the seed MLP's ops at width 64) for the misuse cases, compiled from text.
TINY = """const hidden = 64
recipe fp8 = delayed_scaling(format = hybrid, amax_history = 16, amax_compute = max, margin = 0)
sequence tiny(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) uses fp8 {
  layernorm(hidden, eps = 1e-5)
  linear(hidden, 128, bias = false) as fc1
  swiglu()
  linear(64, hidden, bias = false) as fc2
}
"""


def sequential_squared_norm(values: np.ndarray) -> float:
    # reference/run_steps.cpp's squared_norm: a double sum in element order (cumsum is
    # sequential, unlike numpy.sum's pairwise sum).
    squares = values.astype(np.float64).ravel() ** 2
    return float(np.cumsum(squares)[-1])


def run_steps_like_fusec(session: opfuse.ReferenceSession, steps: int, lr: float) -> str:
    """What `fusec run` prints per step (reference/run_driver.cpp), computed through the package:
    loss 0.5 * mean(y^2), dL/dy = y / numel, gradient norms, quantizers, step(), then SGD."""
    out = ""
    param_names = [t.name for t in session.tensors() if t.kind == opfuse.TensorKind.PARAM]
    for step in range(steps):
        session.forward()
        y = session.output("y")
        sum_squares = sequential_squared_norm(y)
        loss = 0.5 * sum_squares / y.size
        out += f"\nstep {step:>4}  loss {loss:.6e}  |y| {math.sqrt(sum_squares):.6e}\n"
        session.set_tensor("dy", (y.astype(np.float64) / y.size).astype(np.float32))
        session.backward()
        grads = {name: session.param_grad(name) for name in param_names}
        for name in param_names:
            norm = math.sqrt(sequential_squared_norm(grads[name]))
            out += f"  grad   {name:<32} |g| {norm:.6e}\n"
        for q in session.quantizers():
            out += (f"  quant  {q.name:<32} {q.format.name.lower()}  amax {q.amax_history[0]:.6e}"
                    f"  scale {q.scale:.6e}\n")
        session.step()
        for name in param_names:  # ReferenceExecutor::sgd_step: p -= float(lr) * g in fp32
            session.set_tensor(name, session.parameter(name) - np.float32(lr) * grads[name])
    return out


class ReferenceAgainstFusec(unittest.TestCase):
    def test_mlp_two_steps_print_what_fusec_run_prints(self) -> None:
        # The seed MLP at 16 tokens, seed 0: fusec's report from its first step on must be the
        # same text, every loss, gradient norm, amax and scale to 7 digits.
        steps, seed, lr, tokens = 2, 0, 0.01, 16
        fusec = subprocess.run(
            [FUSEC, "run", MLP, "--bind", f"tokens={tokens}", "--device", "cpu", "--steps",
             str(steps), "--seed", str(seed), "--lr", str(lr)],
            check=True, capture_output=True, text=True).stdout
        expected = fusec[fusec.index("\nstep "):]

        program = opfuse.compile(MLP)
        self.assertEqual(program.sequences, ["mlp"])
        session = program.session("mlp", device="cpu", tokens=tokens)
        self.assertIsInstance(session, opfuse.ReferenceSession)
        session.own_parameters(seed)
        x_info = next(t for t in session.tensors() if t.kind == opfuse.TensorKind.INPUT)
        self.assertEqual((x_info.name, list(x_info.shape)), ("x", [tokens, 4096]))
        session.set_tensor("x", opfuse.reference_input(x_info.shape, seed, 0))
        got = run_steps_like_fusec(session, steps, lr)
        self.assertEqual(got, expected)
        # The second step's scales came from the first step's amaxes (step() ran).
        self.assertIn("scale 1.000000e+00", got.split("\nstep    1")[0])
        self.assertNotIn("scale 1.000000e+00", got.split("\nstep    1")[1])


class Results(unittest.TestCase):
    def setUp(self) -> None:
        self.program = opfuse.compile(TINY, name="tiny.fuse")
        self.session = self.program.session(device="cpu", tokens=32)
        self.session.own_parameters(7)
        self.x = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)

    def test_inputs_are_rounded_to_bf16_and_results_are_bf16_values(self) -> None:
        self.session.set_tensor("x", self.x)
        self.session.forward()
        y = self.session.output("y")
        self.assertEqual((y.dtype, y.shape), (np.float32, (32, 64)))
        # Every value is a bf16 value: its low 16 bits are zero.
        self.assertFalse(np.any(y.view(np.uint32) & 0xFFFF))
        # The same input rounded first gives the same bits (rounding happens on set_tensor).
        other = self.program.session(device="cpu", tokens=32)
        other.own_parameters(7)
        rounded = (self.x.view(np.uint32) + 0x7FFF + ((self.x.view(np.uint32) >> 16) & 1))
        other.set_tensor("x", (rounded & 0xFFFF0000).astype(np.uint32).view(np.float32))
        other.forward()
        np.testing.assert_array_equal(other.output("y").view(np.uint32), y.view(np.uint32))

    def test_results_are_copies_that_later_calls_do_not_change(self) -> None:
        self.session.set_tensor("x", self.x)
        self.session.forward()
        first = self.session.output("y")
        kept = first.copy()
        self.session.set_tensor("x", self.x[::-1].copy())
        self.session.forward()
        np.testing.assert_array_equal(first, kept)
        self.assertFalse(np.array_equal(self.session.output("y"), kept))

    def test_parameters_set_are_used(self) -> None:
        self.session.set_tensor("x", self.x)
        self.session.forward()
        before = self.session.output("y")
        zeros = np.zeros((64, 64), np.float32)
        zeros.setflags(write=False)  # read-only arrays are taken too
        self.session.set_tensor("fc2.weight", zeros)
        self.session.forward()
        self.assertFalse(np.any(self.session.output("y")))
        self.assertTrue(np.any(before))

    def test_tensors_lists_the_interface(self) -> None:
        kinds = {(t.kind, t.name): (t.dtype, list(t.shape), t.bytes)
                 for t in self.session.tensors()}
        K, D = opfuse.TensorKind, opfuse.TensorDType
        self.assertEqual(kinds[(K.INPUT, "x")], (D.BF16, [32, 64], 32 * 64 * 2))
        self.assertEqual(kinds[(K.PARAM, "fc1.weight")], (D.BF16, [128, 64], 128 * 64 * 2))
        self.assertEqual(kinds[(K.OUTPUT, "y")], (D.BF16, [32, 64], 32 * 64 * 2))
        self.assertEqual(kinds[(K.OUTPUT_GRAD, "dy")], (D.BF16, [32, 64], 32 * 64 * 2))
        self.assertEqual(kinds[(K.PARAM_GRAD, "fc2.weight")], (D.BF16, [64, 64], 64 * 64 * 2))
        self.assertEqual(len(kinds), 1 + 4 + 1 + 1 + 1 + 4)


class Signature(unittest.TestCase):
    def test_inputs_and_outputs_in_the_order_the_program_declares(self) -> None:
        # tensors() lists outputs by name; the signature keeps the main one first.
        program = opfuse.compile(os.path.join(SOURCE_DIR, "dsl_examples", "mlp_residual.fuse"))
        self.assertEqual(program.signature("fc1"), (["x"], ["h", "residual"]))
        self.assertEqual(program.signature("fc2"), (["h", "residual"], ["y"]))
        self.assertEqual(opfuse.compile(TINY).signature(), (["x"], ["y"]))
        with self.assertRaisesRegex(opfuse.UsageError, "has 2 sequences; name one: fc1, fc2"):
            program.signature()


class CompileOptions(unittest.TestCase):
    def test_block_scaling_is_emulated_when_asked(self) -> None:
        # float8_block_scaling on sm_90a: block-scaled GEMMs over block_cast_transpose copies;
        # emulated, block_fake_quantize's decoded copies and no block cast.
        blocks = TINY.replace("const hidden = 64", "const hidden = 256").replace(
            "linear(hidden, 128", "linear(hidden, 512").replace("linear(64,", "linear(256,").replace(
            "uses fp8", "uses blocks").replace(
            "recipe fp8 =", "recipe blocks = float8_block_scaling()\nrecipe fp8 =")
        native = opfuse.compile(blocks, arch="sm_90a").plan_json
        emulated = opfuse.compile(blocks, arch="sm_90a", emulate_block_scaling=True).plan_json
        self.assertIn("block_cast_transpose", native)
        self.assertNotIn("block_fake_quantize", native)
        self.assertIn("block_fake_quantize", emulated)
        self.assertNotIn("block_cast_transpose", emulated)


class Diagnostics(unittest.TestCase):
    def test_a_program_with_errors_raises_compile_error_with_the_located_text(self) -> None:
        bad = TINY.replace("  swiglu()\n", "  frobnicate(hidden)\n")
        with self.assertRaises(opfuse.CompileError) as caught:
            opfuse.compile(bad, name="bad.fuse")
        message = str(caught.exception)
        self.assertRegex(message, r"^bad\.fuse:6:3: error: unknown op 'frobnicate'\n")
        self.assertIn("\n    frobnicate(hidden)\n    ^\n", message)
        self.assertIsInstance(caught.exception, opfuse.Error)
        self.assertIsInstance(caught.exception, RuntimeError)

    def test_errors_in_a_file_name_the_file(self) -> None:
        path = os.path.join(os.environ["OPFUSE_TEST_WORK_DIR"], "bad_file.fuse")
        with open(path, "w") as f:
            f.write(TINY.replace("linear(64, hidden", "linear(65, hidden"))
        with self.assertRaises(opfuse.CompileError) as caught:
            opfuse.compile(path)
        self.assertRegex(str(caught.exception), r"bad_file\.fuse:7:\d+: error: ")

    def test_unknown_recipe_and_pass_are_usage_or_compile_errors(self) -> None:
        with self.assertRaises(opfuse.CompileError) as caught:
            opfuse.compile(TINY, recipe="fp9")
        self.assertIn("fp9", str(caught.exception))
        with self.assertRaises(opfuse.UsageError) as usage:
            opfuse.compile(TINY, disabled_passes=["no-such-pass"])
        self.assertIn("no-such-pass", str(usage.exception))

    def test_debug_configs_compile_from_text_with_located_errors(self) -> None:
        config = """stats:
  enabled: True
  layers:
    layer_name_regex_pattern: fc1
  transformer_engine:
    LogTensorStats:
      enabled: True
      stats: [max]
      tensors: [activation]
      freq: 1
"""
        program = opfuse.compile(TINY, debug_config=config)
        self.assertTrue(program.has_debug_config)
        self.assertFalse(opfuse.compile(TINY).has_debug_config)
        with self.assertRaisesRegex(opfuse.UsageError, "runs no precision-debug config"):
            program.session(device="cpu", tokens=16)
        with self.assertRaises(opfuse.CompileError) as caught:
            opfuse.compile(TINY, debug_config=config.replace("LogTensorStats", "NoSuchFeature"))
        self.assertRegex(str(caught.exception),
                         r"^debug\.yaml:6:5: error: unknown feature 'NoSuchFeature'\n")

    def test_declared_fusions_join_ops_and_locate_their_errors(self) -> None:
        axpy = """sequence s(x: bf16[tokens, 64], r: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) {
  constant_scale(0.5)
  add_extra_input(r)
}
"""
        plain = opfuse.compile(axpy, arch="sm_90a", use_cache=False)
        fused = opfuse.compile(axpy, arch="sm_90a", use_cache=False, fusions=[
            opfuse.FusionDeclaration("axpy", ["constant_scale", "add_extra_input"])])

        def forward_steps(program: opfuse.Program) -> list:
            return json.loads(program.plan_json)["sequences"][0]["phases"][0]["steps"]

        self.assertEqual(len(forward_steps(plain)), 2)
        steps = forward_steps(fused)
        self.assertEqual(len(steps), 1)
        self.assertEqual(steps[0]["pattern"], "axpy")
        self.assertIn("y = 0.5 * x + residual", steps[0]["what"])
        with self.assertRaises(opfuse.CompileError) as caught:
            opfuse.compile(axpy, arch="sm_90a", fusions=[opfuse.FusionDeclaration(
                "late", ["gelu", "cast_fp8"], phase=opfuse.FusionDeclaration.Phase.BACKWARD,
                priority=500)])
        self.assertRegex(str(caught.exception),
                         r"^<CompileOptions\.fusions\[0\]>:1:\d+: error: priority 500 is out "
                         r"of range for fusion 'late'")
        with self.assertRaises(opfuse.UsageError):
            opfuse.compile(axpy, fusions=[opfuse.FusionDeclaration("a b", ["bias", "gelu"])])

    def test_a_missing_file_is_a_usage_error(self) -> None:
        with self.assertRaisesRegex(opfuse.UsageError, "nowhere.fuse: no such file"):
            opfuse.compile("nowhere.fuse")


class Misuse(unittest.TestCase):
    def setUp(self) -> None:
        self.program = opfuse.compile(TINY, name="tiny.fuse")

    def session(self) -> opfuse.ReferenceSession:
        session = self.program.session(device="cpu", tokens=16)
        session.own_parameters(0)
        return session

    def test_sizes_and_sequences_are_checked(self) -> None:
        with self.assertRaisesRegex(opfuse.UsageError, "tokens"):
            self.program.session(device="cpu")
        with self.assertRaisesRegex(opfuse.UsageError, "no sequence 'mlp' in tiny.fuse; sequences: tiny"):
            self.program.session("mlp", device="cpu", tokens=16)
        with self.assertRaisesRegex(opfuse.UsageError, "sizes are ints"):
            self.program.session(device="cpu", tokens=16.0)  # type: ignore[arg-type]
        with self.assertRaisesRegex(opfuse.UsageError, "device must be"):
            self.program.session(device="tpu", tokens=16)

    def test_arrays_of_the_wrong_shape_dtype_layout_or_name_are_refused(self) -> None:
        session = self.session()
        x = np.ones((16, 64), np.float32)
        with self.assertRaisesRegex(opfuse.UsageError, r"set_tensor\('x'\): the input 'x' has "
                                    r"shape \[16, 64\], the array has shape \[8, 64\]"):
            session.set_tensor("x", x[:8])
        with self.assertRaisesRegex(opfuse.UsageError, r"the array is float64"):
            session.set_tensor("x", x.astype(np.float64))
        with self.assertRaisesRegex(opfuse.UsageError, "not dense and row-major"):
            session.set_tensor("x", np.ones((64, 16), np.float32).T)
        with self.assertRaisesRegex(opfuse.UsageError, "takes no such tensor; it takes: x, "):
            session.set_tensor("z", x)

    def test_calls_out_of_order_are_refused_and_change_nothing(self) -> None:
        session = self.session()
        with self.assertRaisesRegex(opfuse.UsageError, r"reads \[x\], which were not set"):
            session.forward()
        with self.assertRaisesRegex(opfuse.UsageError, "needs a training forward first"):
            session.backward()
        with self.assertRaisesRegex(opfuse.UsageError, "no forward has run yet"):
            session.output("y")
        session.set_tensor("x", np.ones((16, 64), np.float32))
        session.forward(mode=opfuse.RunMode.INFERENCE)
        with self.assertRaisesRegex(opfuse.UsageError, "needs a training forward first"):
            session.backward()
        session.forward()
        with self.assertRaisesRegex(opfuse.UsageError, r"reads \[dy\], which were not set"):
            session.backward()
        with self.assertRaisesRegex(opfuse.UsageError, "no output 'x'"):
            session.output("x")
        # After the refusals the session still runs.
        session.set_tensor("dy", np.ones((16, 64), np.float32))
        session.backward()
        self.assertEqual(session.input_grad("x").shape, (16, 64))

    def test_the_gpu_session_without_a_gpu_says_so(self) -> None:
        if opfuse.gpu_available():
            self.skipTest("a GPU is present")
        with self.assertRaisesRegex(opfuse.UsageError, "GPU|driver"):
            self.program.session(device="cuda", tokens=16)
        # 'auto' falls back to the CPU reference.
        self.assertIsInstance(self.program.session(tokens=16), opfuse.ReferenceSession)
        with self.assertRaisesRegex(opfuse.UsageError, "options"):
            self.program.session(device="cpu", options=opfuse.SessionOptions(), tokens=16)

    def test_streams_of_the_wrong_type_are_refused(self) -> None:
        with self.assertRaisesRegex(TypeError, "stream"):
            self.program.session(device="cuda", stream="default", tokens=16)

    def test_the_torch_module_is_not_imported_with_the_package(self) -> None:
        import sys

        self.assertNotIn("torch", sys.modules)


if __name__ == "__main__":
    unittest.main(verbosity=2)
