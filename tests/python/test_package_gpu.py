"""The installed `opfuse` package on a GPU with torch: opfuse.torch.Sequential trains the seed MLP
(dsl_examples/mlp.fuse) under torch.optim.SGD bit for bit as the session driven directly does,
its gradients match a PyTorch eager implementation within the GPU tests' bounds
(tests/gpu/test_executor_gpu.cpp: 1e-2 relative error norm under bf16), nothing waits for the GPU,
state_dict() carries the quantizer state, and wrong tensors are refused.

Run by tests/python/run_package_tests.sh gpu (ctest: python_package_gpu, label gpu); prints
"[  SKIPPED ]" and exits 0 without torch or a GPU.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import unittest

try:
    import torch
except ImportError:
    print("[  SKIPPED ] python_package_gpu: torch is not installed")
    sys.exit(0)

import opfuse

if not torch.cuda.is_available() or not opfuse.gpu_available():
    print("[  SKIPPED ] python_package_gpu: no GPU: " + opfuse.gpu_unavailable_reason())
    sys.exit(0)

import opfuse.torch as opfuse_torch  # noqa: E402

MLP = os.path.join(os.environ["OPFUSE_SOURCE_DIR"], "dsl_examples", "mlp.fuse")
TOKENS = 64
HIDDEN = 4096


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    # tests/gpu/test_executor_gpu.cpp's relative_error: |got - want| / |want| (2-norms).
    diff = (got.double() - want.double()).norm().item()
    norm = want.double().norm().item()
    return diff if norm == 0 else diff / norm


def loss_of(y: torch.Tensor) -> torch.Tensor:
    return 0.5 * (y.float() ** 2).mean()


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a,
                    b.view(torch.int16) if b.dtype == torch.bfloat16 else b))


class Sequential(unittest.TestCase):
    program: opfuse.Program
    bf16_program: opfuse.Program

    @classmethod
    def setUpClass(cls) -> None:
        cls.program = opfuse.compile(MLP)
        cls.bf16_program = opfuse.compile(MLP, recipe="bf16")

    def x(self, seed: int) -> torch.Tensor:
        generator = torch.Generator(device="cuda").manual_seed(seed)
        return torch.randn(TOKENS, HIDDEN, device="cuda", generator=generator).bfloat16()

    def test_trains_under_sgd_bit_for_bit_as_the_session(self) -> None:
        module = opfuse_torch.Sequential(self.program, "mlp", seed=0, tokens=TOKENS)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
        module.register_optimizer(optimizer)

        # The same sequence driven through the Session: its own parameters (same seed), the
        # same SGD (torch.optim over views of them), step() by hand.
        stream = torch.cuda.current_stream().cuda_stream
        session = self.program.session("mlp", device="cuda", stream=stream, tokens=TOKENS)
        session.own_parameters(0, stream)
        names = [t.name for t in session.tensors() if t.kind == opfuse.TensorKind.PARAM]
        params = {n: torch.from_dlpack(session.parameter(n)).requires_grad_() for n in names}
        reference_optimizer = torch.optim.SGD(list(params.values()), lr=0.01)
        for name in names:
            self.assertTrue(bits_equal(module.get_parameter(name).detach(), params[name].detach()),
                            name)

        for step in range(4):
            x = self.x(step)
            optimizer.zero_grad()
            y = module(x)
            loss = loss_of(y)
            loss.backward()
            optimizer.step()  # and module.step() through the hook

            session.set_tensor("x", x)
            session.forward(stream)
            y_session = torch.from_dlpack(session.output("y")).clone().requires_grad_()
            loss_of(y_session).backward()  # the same dL/dy, by the same kernels
            assert y_session.grad is not None
            session.set_tensor("dy", y_session.grad)
            session.backward(stream)
            for name in names:
                params[name].grad = torch.from_dlpack(session.param_grad(name)).clone()
            with torch.no_grad():
                reference_optimizer.step()
            session.step(stream)
            session.parameters_changed()

            self.assertTrue(bits_equal(y.detach(), y_session.detach()), f"step {step}: y")
            for name in names:
                grad = module.get_parameter(name).grad
                assert grad is not None
                self.assertTrue(bits_equal(grad, params[name].grad), f"step {step}: {name} grad")
                self.assertTrue(bits_equal(module.get_parameter(name).detach(),
                                           params[name].detach()), f"step {step}: {name}")
            got = module.session.quantizers(stream)
            want = session.quantizers(stream)
            self.assertEqual([(q.name, q.amax_history, q.scale) for q in got],
                             [(q.name, q.amax_history, q.scale) for q in want], f"step {step}")
        # The quantizers moved: step() ran through the optimizer's hook.
        self.assertTrue(all(q.scale != 1.0 for q in module.session.quantizers(stream)))

    def test_the_cpp_runner_runs_every_call_and_equals_the_python_path(self) -> None:
        # The package built against this torch (bench/run_gpu.sh and run_package_tests.sh build
        # without isolation) has opfuse._opfuse_torch: every call runs through its runner. A
        # second module on the Python path, same seed, same data, same SGD, must agree bit for
        # bit: outputs, input and parameter gradients, parameters, quantizers, through
        # inference forwards and an in-place parameter write too.
        if os.environ.get("OPFUSE_TORCH_NATIVE", "1") != "0":
            self.assertIsNotNone(opfuse_torch._native, "the package has no opfuse._opfuse_torch")
        native = opfuse_torch.Sequential(self.program, "mlp", seed=5, tokens=TOKENS)
        python = opfuse_torch.Sequential(self.program, "mlp", seed=5, tokens=TOKENS)
        python._runner = None
        self.assertEqual(native.native, opfuse_torch._native is not None)
        self.assertFalse(python.native)
        optimizers = []
        for module in (native, python):
            optimizer = torch.optim.SGD(module.parameters(), lr=0.02)
            module.register_optimizer(optimizer)
            optimizers.append(optimizer)
        stream = torch.cuda.current_stream().cuda_stream
        for step in range(4):
            results = []
            for module, optimizer in zip((native, python), optimizers):
                x = self.x(40 + step).requires_grad_()
                optimizer.zero_grad()
                y = module(x)
                loss_of(y).backward()
                optimizer.step()
                with torch.no_grad():
                    y_inference = module(self.x(60 + step))
                results.append((y.detach(), x.grad, y_inference,
                                {n: (p.detach().clone(), p.grad)
                                 for n, p in module.named_parameters()}))
            (y_a, dx_a, yi_a, p_a), (y_b, dx_b, yi_b, p_b) = results
            self.assertTrue(bits_equal(y_a, y_b), f"step {step}: y")
            assert dx_a is not None and dx_b is not None
            self.assertTrue(bits_equal(dx_a, dx_b), f"step {step}: dx")
            self.assertTrue(bits_equal(yi_a, yi_b), f"step {step}: inference y")
            for name in p_a:
                self.assertTrue(bits_equal(p_a[name][0], p_b[name][0]), f"step {step}: {name}")
                grad_a, grad_b = p_a[name][1], p_b[name][1]
                assert grad_a is not None and grad_b is not None
                self.assertTrue(bits_equal(grad_a, grad_b), f"step {step}: {name} grad")
            self.assertEqual([(q.name, q.amax_history, q.scale)
                              for q in native.session.quantizers(stream)],
                             [(q.name, q.amax_history, q.scale)
                              for q in python.session.quantizers(stream)], f"step {step}")
            if step == 1:
                # Written in place without step(): both notice (version counters) and recast.
                for module in (native, python):
                    with torch.no_grad():
                        module.get_parameter("fc1.weight").mul_(0.5)

    def test_a_module_dropped_after_its_forward_still_runs_its_backward(self) -> None:
        # The autograd node keeps the session alive (the C++ runner's core in its saved data, the
        # Python path's ctx.module): the backward of a module nobody holds any more runs and
        # gives the bits a kept module gives.
        for native in (True, False):
            kept = opfuse_torch.Sequential(self.bf16_program, "mlp", seed=6, tokens=TOKENS)
            dropped = opfuse_torch.Sequential(self.bf16_program, "mlp", seed=6, tokens=TOKENS)
            if not native:
                kept._runner = None
                dropped._runner = None
            x_kept, x = self.x(70).requires_grad_(), self.x(70).requires_grad_()
            loss_of(kept(x_kept)).backward()
            y = dropped(x)
            del dropped
            gc.collect()
            loss_of(y).backward()
            assert x.grad is not None and x_kept.grad is not None
            self.assertTrue(bits_equal(x.grad, x_kept.grad), f"native {native}")

    def test_gradients_match_pytorch_eager_within_the_gpu_tests_bound(self) -> None:
        module = opfuse_torch.Sequential(self.bf16_program, "mlp", seed=3, tokens=TOKENS)
        x = self.x(11).requires_grad_()
        y = module(x)
        loss_of(y).backward()

        # PyTorch eager in bf16, as a bf16 model runs in torch (each op's result in bf16).
        weights = {n: p.detach().clone().requires_grad_() for n, p in module.named_parameters()}
        x_eager = x.detach().clone().requires_grad_()
        h = torch.nn.functional.layer_norm(x_eager, (HIDDEN,), weights["layernorm_0.weight"],
                                           weights["layernorm_0.bias"], eps=1e-5)
        h = h @ weights["fc1.weight"].t()
        gate, value = h.chunk(2, dim=-1)  # SwiGLU: the first half is the gate
        h = torch.nn.functional.silu(gate) * value
        y_eager = h @ weights["fc2.weight"].t()
        loss_of(y_eager).backward()

        bound = 1e-2  # bound_for("bf16") in tests/gpu/test_executor_gpu.cpp
        errors = {"y": relative_error(y.detach(), y_eager.detach())}
        assert x.grad is not None and x_eager.grad is not None
        errors["dx"] = relative_error(x.grad, x_eager.grad)
        for name, p in module.named_parameters():
            assert p.grad is not None
            errors[name] = relative_error(p.grad, weights[name].grad)  # type: ignore[arg-type]
        print("[ errors   ] " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
        for name, error in errors.items():
            self.assertLessEqual(error, bound, name)

    def test_extra_outputs_and_inputs_carry_gradients_as_in_te(self) -> None:
        # dsl_examples/mlp_residual.fuse: fc1 returns (h, residual), fc2 takes (h, residual); the
        # residual's gradient reaches x through both modules.
        program = opfuse.compile(os.path.join(os.path.dirname(MLP), "mlp_residual.fuse"),
                                 recipe="bf16")
        fc1 = opfuse_torch.Sequential(program, "fc1", seed=1, tokens=TOKENS)
        fc2 = opfuse_torch.Sequential(program, "fc2", seed=2, tokens=TOKENS)
        self.assertEqual((fc1.output_names, fc2.input_names), (["h", "residual"],) * 2)
        x = self.x(12).requires_grad_()
        h, residual = fc1(x)
        y = fc2(h, residual)
        loss_of(y).backward()

        w = {f"fc1.{n}": p.detach().clone().requires_grad_() for n, p in fc1.named_parameters()}
        w.update({f"fc2.{n}": p.detach().clone().requires_grad_()
                  for n, p in fc2.named_parameters()})
        x_eager = x.detach().clone().requires_grad_()  # eager in bf16
        normed = torch.nn.functional.layer_norm(x_eager, (HIDDEN,), w["fc1.layernorm_0.weight"],
                                                w["fc1.layernorm_0.bias"], eps=1e-5)
        gate, value = (normed @ w["fc1.up_proj.weight"].t()).chunk(2, dim=-1)
        y_eager = (torch.nn.functional.silu(gate) * value) @ w["fc2.down_proj.weight"].t() + x_eager
        loss_of(y_eager).backward()
        assert x.grad is not None and x_eager.grad is not None
        self.assertTrue(bits_equal(residual.detach(), x.detach()))
        self.assertLessEqual(relative_error(y.detach(), y_eager.detach()), 1e-2)
        self.assertLessEqual(relative_error(x.grad, x_eager.grad), 1e-2)
        grad = fc1.get_parameter("up_proj.weight").grad
        assert grad is not None
        self.assertLessEqual(relative_error(grad, w["fc1.up_proj.weight"].grad), 1e-2)  # type: ignore[arg-type]

    def test_no_call_waits_for_the_gpu(self) -> None:
        module = opfuse_torch.Sequential(self.program, "mlp", seed=0, tokens=TOKENS)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
        module.register_optimizer(optimizer)
        x = self.x(5)
        for _ in range(2):  # warm: the first forward allocates, the kernels load
            loss_of(module(x)).backward()
            optimizer.step()
        torch.cuda.synchronize()
        # With the stream held busy, a step that waited for the GPU would return only after the
        # busy kernel; one that does not returns at once, the stream still busy.
        torch.cuda._sleep(2_000_000_000)  # about a second
        start = time.perf_counter()
        loss_of(module(x)).backward()
        optimizer.step()
        with torch.no_grad():
            module(x)
        host_seconds = time.perf_counter() - start
        still_busy = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        self.assertTrue(still_busy, f"the stream drained within {host_seconds:.3f} s")
        self.assertLess(host_seconds, 0.25)

    def test_the_profiler_sees_no_synchronization_in_a_training_step(self) -> None:
        module = opfuse_torch.Sequential(self.program, "mlp", seed=0, tokens=TOKENS)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
        module.register_optimizer(optimizer)
        x = self.x(8)
        for _ in range(2):
            loss_of(module(x)).backward()
            optimizer.step()
        torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profile:
            with torch.profiler.record_function("opfuse_training_steps"):
                for _ in range(2):
                    optimizer.zero_grad()
                    loss_of(module(x)).backward()
                    optimizer.step()
        events = profile.events()
        window = next(e.time_range for e in events if e.name == "opfuse_training_steps")
        # Within the steps (the profiler synchronizes when it stops): cudaStreamSynchronize,
        # cudaDeviceSynchronize, cudaEventSynchronize, the host waiting for the GPU.
        inside = [e for e in events
                  if e.time_range.start >= window.start and e.time_range.end <= window.end]
        syncs = sorted({e.name for e in inside if "Synchronize" in e.name})
        launches = sum("LaunchKernel" in e.name or "GraphLaunch" in e.name for e in inside)
        print(f"[ profile  ] {len(inside)} events in the steps, {launches} launches seen, "
              f"synchronizations: {syncs}")
        self.assertEqual(syncs, [])

    def test_state_dict_carries_parameters_and_the_quantizer_state_alone(self) -> None:
        trained = opfuse_torch.Sequential(self.program, "mlp", seed=0, tokens=TOKENS)
        optimizer = torch.optim.SGD(trained.parameters(), lr=0.01)
        trained.register_optimizer(optimizer)
        for step in range(3):
            loss_of(trained(self.x(step))).backward()
            optimizer.step()
        state = trained.state_dict()
        self.assertIn("_extra_state", state)
        self.assertIn("fc1.weight", state)
        stream = torch.cuda.current_stream().cuda_stream
        # As saved (a forward measures its amaxes into slot 0 of the histories).
        saved = [(q.name, q.amax_history, q.scale) for q in trained.session.quantizers(stream)]
        restored = opfuse_torch.Sequential(self.program, "mlp", seed=1, tokens=TOKENS)
        restored.load_state_dict(state)
        self.assertEqual([(q.name, q.amax_history, q.scale)
                          for q in restored.session.quantizers(stream)], saved)
        x = self.x(9)
        with torch.no_grad():
            self.assertTrue(bits_equal(restored(x), trained(x)))
        # The extra state is the quantizer state alone, not a second copy of the parameters...
        weight_bytes = sum(p.numel() * p.element_size() for p in trained.parameters())
        self.assertLess(state["_extra_state"].numel(), weight_bytes // 4)
        # ... so parameters changed in the dict before loading stay as changed.
        edited = dict(state)
        edited["fc1.weight"] = state["fc1.weight"] * 0.5
        halved = opfuse_torch.Sequential(self.program, "mlp", seed=1, tokens=TOKENS)
        halved.load_state_dict(edited)
        self.assertTrue(bits_equal(dict(halved.named_parameters())["fc1.weight"].detach(),
                                   edited["fc1.weight"]))
        self.assertEqual([(q.name, q.amax_history, q.scale)
                          for q in halved.session.quantizers(stream)], saved)

    def test_wrong_tensors_are_refused_before_anything_runs(self) -> None:
        module = opfuse_torch.Sequential(self.program, "mlp", seed=0, tokens=TOKENS)
        x = self.x(0)
        with self.assertRaisesRegex(opfuse.UsageError, r"input 'x' is torch.bfloat16, the tensor "
                                    r"is torch.float32"):
            module(x.float())
        with self.assertRaisesRegex(opfuse.UsageError, r"has shape \[64, 4096\], the tensor "
                                    r"\[32, 4096\]"):
            module(x[:32])
        with self.assertRaisesRegex(opfuse.UsageError, "not dense and row-major"):
            module(torch.empty(HIDDEN, TOKENS, device="cuda", dtype=torch.bfloat16).t())
        with self.assertRaisesRegex(opfuse.UsageError, "the tensor is on cpu"):
            module(x.cpu())
        with self.assertRaisesRegex(opfuse.UsageError, "takes 1 inputs"):
            module(x, x)
        first = module(x)
        module(x)
        with self.assertRaisesRegex(opfuse.UsageError, "backward of an earlier forward"):
            loss_of(first).backward()
        # The session still trains after the refusals.
        y = module(x)
        loss_of(y).backward()
        self.assertIsNotNone(module.get_parameter("fc1.weight").grad)

    def test_session_tensors_through_dlpack_without_copies(self) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        session = self.program.session("mlp", device="cuda", stream=stream, tokens=TOKENS)
        session.own_parameters(0, stream)
        x = self.x(1)
        session.set_tensor("x", x)
        session.forward(stream)
        first = torch.from_dlpack(session.output("y"))
        self.assertEqual((first.dtype, list(first.shape)), (torch.bfloat16, [TOKENS, HIDDEN]))
        # A view of the session's memory: the next forward writes it in place.
        pointer = first.data_ptr()
        session.set_tensor("x", self.x(2))
        session.forward(stream)
        self.assertEqual(torch.from_dlpack(session.output("y")).data_ptr(), pointer)
        # set_tensor reads the caller's memory in place: changing x changes the next output.
        x2 = self.x(3)
        session.set_tensor("x", x2)
        session.forward(stream)
        before = torch.from_dlpack(session.output("y")).clone()
        x2.mul_(-1)
        session.forward(stream)
        self.assertFalse(bits_equal(before, torch.from_dlpack(session.output("y"))))
        with self.assertRaisesRegex(opfuse.UsageError, "NumPy arrays run on the CPU reference"):
            session.set_tensor("x", x.cpu().float().numpy())

    # A small fp16 block (CuPy has no bfloat16): the same program run from torch tensors and from
    # another framework's arrays gives the same bytes; the session reads the arrays in place and
    # its outputs are views the other framework sees at the same address.
    SMALL_FP16 = """
sequence block(x: fp16[tokens, 256]) -> (y: fp16[tokens, 256]) uses bf16 {
  layernorm(256)
  linear(256, 512, bias = true) as fc1
  gelu()
  linear(512, 256, bias = true) as fc2
}
"""

    def run_small(self, give: object, take: object) -> torch.Tensor:
        """Inference forward of SMALL_FP16 on x = the torch input seeded 5, given through
        `give(torch_tensor) -> array`; returns y as torch (copied), after checking that `take`
        (DLPack view -> the framework's array) sees the session's memory in place."""
        program = opfuse.compile(self.SMALL_FP16, name="small_fp16.fuse")
        stream = torch.cuda.current_stream().cuda_stream
        session = program.session("block", device="cuda", stream=stream, tokens=TOKENS)
        session.own_parameters(0, stream)
        generator = torch.Generator(device="cuda").manual_seed(5)
        x = torch.randn(TOKENS, 256, device="cuda", generator=generator).half()
        array = give(x)  # type: ignore[operator]
        session.set_tensor("x", array)
        session.forward(stream, opfuse.RunMode.INFERENCE)
        torch.cuda.current_stream().synchronize()
        y_view = torch.from_dlpack(session.output("y"))
        pointer = take(session.output("y"))  # type: ignore[operator]
        self.assertEqual(pointer, y_view.data_ptr(), "the framework sees the session's memory")
        return y_view.clone()

    def probe_view(self) -> object:
        program = opfuse.compile(self.SMALL_FP16, name="small_fp16.fuse")
        stream = torch.cuda.current_stream().cuda_stream
        session = program.session("block", device="cuda", stream=stream, tokens=TOKENS)
        session.own_parameters(0, stream)
        return session.parameter("fc1.weight")

    def test_cupy_arrays_in_and_out_without_copies(self) -> None:
        try:
            import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]
        except ImportError:
            self.skipTest("cupy is not installed")
        want = self.run_small(lambda x: x, lambda view: torch.from_dlpack(view).data_ptr())
        kept = {}

        def give(x: torch.Tensor) -> object:
            array = cupy.from_dlpack(x).copy()  # its own memory, filled from torch's values
            kept["x"] = array
            return array

        got = self.run_small(give, lambda view: cupy.from_dlpack(view).data.ptr)
        self.assertTrue(bits_equal(got, want))
        # In place: the session reads the cupy array itself (a changed value changes the output).
        program = opfuse.compile(self.SMALL_FP16, name="small_fp16.fuse")
        stream = torch.cuda.current_stream().cuda_stream
        session = program.session("block", device="cuda", stream=stream, tokens=TOKENS)
        session.own_parameters(0, stream)
        x = kept["x"]
        session.set_tensor("x", x)
        session.forward(stream, opfuse.RunMode.INFERENCE)
        before = torch.from_dlpack(session.output("y")).clone()
        x *= -1
        torch.cuda.synchronize()
        session.forward(stream, opfuse.RunMode.INFERENCE)
        self.assertFalse(bits_equal(before, torch.from_dlpack(session.output("y"))))
        print(f"[ cupy     ] {cupy.__version__}: same bytes as from torch, read and viewed in place")

    def test_jax_arrays_in_and_out(self) -> None:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        try:
            import jax  # type: ignore[import-not-found, import-untyped, unused-ignore]
            import jax.numpy as jnp  # type: ignore[import-not-found, import-untyped, unused-ignore]
        except ImportError:
            self.skipTest("jax is not installed")
        if not any(d.platform == "gpu" for d in jax.devices()):
            self.skipTest("jax sees no GPU")
        want = self.run_small(lambda x: x, lambda view: torch.from_dlpack(view).data_ptr())

        def give(x: torch.Tensor) -> object:
            # Through host memory: a jax array of its own on the GPU, holding torch's values.
            array = jnp.asarray(x.cpu().numpy(), dtype=jnp.float16)
            array.block_until_ready()
            return array

        def take(view: object) -> int:
            array = jax.dlpack.from_dlpack(view)
            return int(array.unsafe_buffer_pointer())

        print(f"[ jax      ] {jax.__version__}; a view is {type(self.probe_view())!r} with "
              f"{[m for m in ('__dlpack__', '__dlpack_device__') if hasattr(self.probe_view(), m)]}")

        got = self.run_small(give, take)
        self.assertTrue(bits_equal(got, want))
        print(f"[ jax      ] {jax.__version__}: same bytes as from torch, outputs viewed in place")

    def test_graph_replays_equal_eager_steps_and_checkpoints_restore(self) -> None:
        torch_stream = torch.cuda.Stream()
        stream = torch_stream.cuda_stream
        with torch.cuda.stream(torch_stream):
            x = self.x(4)
            dy = self.x(6)
            sessions = []
            for _ in range(2):
                session = self.program.session("mlp", device="cuda", stream=torch_stream,
                                               tokens=TOKENS)
                session.own_parameters(0, torch_stream)
                session.set_tensor("x", x)
                session.set_tensor("dy", dy)
                sessions.append(session)
            eager, graphed = sessions
            graphed.capture(torch_stream, opfuse.GraphScope.TRAINING_STEP)
            self.assertTrue(graphed.has_graph)
            with self.assertRaisesRegex(opfuse.UsageError, "release_graph"):
                graphed.forward(stream)
            for _ in range(3):
                eager.forward(stream)
                eager.backward(stream)
                eager.step(stream)
                graphed.replay(stream)
            for name in ("fc1.weight", "fc2.weight"):
                self.assertTrue(bits_equal(torch.from_dlpack(eager.param_grad(name)),
                                           torch.from_dlpack(graphed.param_grad(name))), name)
            self.assertEqual([q.scale for q in eager.quantizers(stream)],
                             [q.scale for q in graphed.quantizers(stream)])
            graphed.release_graph()
            memory = eager.memory()
            self.assertGreater(memory.reserved_bytes, 0)
            self.assertGreaterEqual(memory.peak_bytes, memory.live_bytes)

            path = os.path.join(os.environ["OPFUSE_TEST_WORK_DIR"], "mlp.state")
            eager.save(path, stream)
            fresh = self.program.session("mlp", device="cuda", stream=stream, tokens=TOKENS)
            fresh.allocate_parameters(stream)
            fresh.load(path, stream)
            self.assertEqual([(q.name, q.amax_history) for q in fresh.quantizers(stream)],
                             [(q.name, q.amax_history) for q in eager.quantizers(stream)])
            self.assertTrue(bits_equal(torch.from_dlpack(fresh.parameter("fc1.weight")),
                                       torch.from_dlpack(eager.parameter("fc1.weight"))))
            with open(path, "r+b") as f:  # a flipped byte: refused, nothing loaded
                f.seek(100)
                byte = f.read(1)
                f.seek(100)
                f.write(bytes([byte[0] ^ 0xFF]))
            with self.assertRaises(opfuse.StateFileError):
                fresh.load(path, stream)
        torch_stream.synchronize()

    def test_host_time_per_forward(self) -> None:
        # Measured, not asserted (benchmarks are programs, docs/design.md): the host time of a
        # forward of the tiny MLP (bench/workloads/mlp_tiny.fuse, 32 tokens as bench/run_gpu.sh
        # runs it) through the module and through the Session binding (the C++ call plus
        # nanobind's few hundred ns); the goal is at most 15 us above the session's.
        tiny = opfuse.compile(os.path.join(os.path.dirname(MLP), "..", "bench", "workloads",
                                           "mlp_tiny.fuse"))
        tokens, hidden = 32, 256
        module = opfuse_torch.Sequential(tiny, "mlp", seed=0, tokens=tokens)
        stream = torch.cuda.current_stream().cuda_stream
        session = tiny.session("mlp", device="cuda", stream=stream, tokens=tokens)
        session.own_parameters(0, stream)
        x = torch.randn(tokens, hidden, device="cuda").bfloat16()
        session.set_tensor("x", x)
        session.set_tensor("dy", x)
        runs = 300

        def per_call(call: object) -> float:
            for _ in range(30):
                call()  # type: ignore[operator]
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(runs):
                call()  # type: ignore[operator]
            elapsed = time.perf_counter() - start
            torch.cuda.synchronize()
            return elapsed / runs * 1e6

        python = opfuse_torch.Sequential(tiny, "mlp", seed=0, tokens=tokens)
        python._runner = None  # the Python path, for comparison
        with torch.no_grad():
            module_inference = per_call(lambda: module(x))
            python_inference = per_call(lambda: python(x))
        session_inference = per_call(lambda: session.forward(stream, opfuse.RunMode.INFERENCE))
        module_training = per_call(lambda: module(x))
        python_training = per_call(lambda: python(x))
        session_training = per_call(lambda: session.forward(stream))
        print(f"[ host us  ] the Python path (no C++ runner): inference {python_inference:.1f} us, "
              f"training {python_training:.1f} us; the module here: "
              f"{'C++ runner' if module.native else 'Python path'}")
        # What a binding call costs beyond its C++ body (a call whose body reads one flag): the
        # C++ session's own host time is Session.forward's minus at most this.
        binding = per_call(lambda: session.has_graph)
        for mode, ours, theirs in (("inference", module_inference, session_inference),
                                   ("training", module_training, session_training)):
            print(f"[ host us  ] {mode} forward of mlp_tiny, {tokens} tokens: Sequential "
                  f"{ours:.1f} us, Session.forward {theirs:.1f} us (of which the binding at "
                  f"most {binding:.2f} us): {ours - theirs:+.1f} us over the binding, at most "
                  f"{ours - theirs + binding:+.1f} us over the C++ session (goal: at most +15)")
        # Where the module's time goes beyond the session's (the functions by their own time).
        import cProfile
        import pstats
        for mode in ("inference", "training"):
            profile = cProfile.Profile()
            with torch.set_grad_enabled(mode == "training"):
                profile.enable()
                for _ in range(100):
                    module(x)
                profile.disable()
            torch.cuda.synchronize()
            rows = sorted(pstats.Stats(profile).stats.items(), key=lambda kv: -kv[1][2])[:8]
            print(f"[ host us  ] {mode}: " + "; ".join(
                f"{func[2]} {stat[2] / 100 * 1e6:.1f}" for func, stat in rows))
        self.assertGreater(module_inference, 0)


class QuantizedTensors(unittest.TestCase):
    """dsl_examples/mlp_residual.fuse passes h in FP8 (docs/python.md, "Quantized tensors"): fc1's
    quantized_output("h") is DLPack views of its copies and scale_inv, fc2.set_quantized() takes
    them, and the split MLP's training step gives what the same ops in one session give."""

    def test_the_split_mlp_passes_fp8_and_matches_the_whole_one(self) -> None:
        tokens = 128
        with open(os.path.join(os.path.dirname(MLP), "mlp_residual.fuse")) as f:
            split = f.read().replace(" with fp8_weights", "").replace("28672", "1024")
        whole = split[:split.index("sequence fc1")] + """
sequence mlp(x: bf16[tokens, hidden], residual: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden])
    uses fp8 {
  layernorm(hidden, eps = 1e-5)
  linear(hidden, ffn, bias = false) as up_proj
  swiglu()
  linear(ffn / 2, hidden, bias = false) as down_proj
  add_extra_input(residual)
}
"""
        stream = torch.cuda.current_stream().cuda_stream
        program = opfuse.compile(split, name="mlp_residual.fuse")
        fc1 = program.session("fc1", device="cuda", stream=stream, tokens=tokens)
        fc2 = program.session("fc2", device="cuda", stream=stream, tokens=tokens)
        one = opfuse.compile(whole, name="whole.fuse").session("mlp", device="cuda",
                                                                stream=stream, tokens=tokens)
        one.own_parameters(4, stream)
        for name in ("layernorm_0.weight", "layernorm_0.bias", "up_proj.weight"):
            fc1.set_tensor(name, one.parameter(name))
        fc2.set_tensor("down_proj.weight", one.parameter("down_proj.weight"))
        infos = {(i["name"], i["kind"]): i for i in fc1.quantized_tensors() + fc2.quantized_tensors()}
        self.assertEqual(infos[("h", "output")]["format"], "e4m3")
        self.assertEqual(infos[("h", "input")]["shape"], [tokens, 512])
        x = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
        dy = (torch.randn(tokens, HIDDEN, device="cuda") * 1e-2).bfloat16()
        one.set_tensor("x", x)
        one.set_tensor("residual", x)
        one.set_tensor("dy", dy)
        one.forward(stream)
        one.backward(stream)
        fc1.set_tensor("x", x)
        fc1.forward(stream)
        h = fc1.quantized_output("h")
        rowwise = torch.from_dlpack(h["rowwise"])
        self.assertEqual((rowwise.dtype, list(rowwise.shape)), (torch.uint8, [tokens, 512]))
        self.assertEqual(list(torch.from_dlpack(h["columnwise"]).shape), [512, tokens])
        self.assertEqual(h["scales"], "tensor")
        fc2.set_quantized("h", **h)
        fc2.set_tensor("residual", fc1.output("residual"))
        fc2.set_tensor("dy", dy)
        fc2.forward(stream)
        fc2.backward(stream)
        fc1.set_tensor("dh", fc2.input_grad("h"))
        fc1.set_tensor("dresidual", fc2.input_grad("residual"))
        fc1.backward(stream)
        y_one, y_two = torch.from_dlpack(one.output("y")), torch.from_dlpack(fc2.output("y"))
        self.assertLessEqual(relative_error(y_two, y_one), 1e-3)
        dx_one, dx_two = torch.from_dlpack(one.input_grad("x")), torch.from_dlpack(fc1.input_grad("x"))
        dres_one = torch.from_dlpack(one.input_grad("residual"))
        self.assertLessEqual(relative_error(dx_two, dx_one.float() + dres_one.float()), 1e-2)
        with self.assertRaisesRegex(opfuse.UsageError, "is quantized: give its copies"):
            fc2.set_tensor("h", rowwise)
        with self.assertRaisesRegex(opfuse.UsageError, "8-bit codes"):
            fc2.set_quantized("h", torch.zeros(tokens, 512, device="cuda"), h["scale_inv"])

    def test_quantize_and_dequantize_round_trip(self) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        x = (torch.randn(200, 384, device="cuda") * 3).bfloat16()
        for scales in ("tensor", "block_1x128", "block_128x128"):
            info = opfuse.quantized_tensor_info([200, 384], scales)
            self.assertEqual((info["rows"], info["cols"]), (200, 384))
            row = torch.empty(200, 384, dtype=torch.uint8, device="cuda")
            col = torch.empty(384, 200, dtype=torch.uint8, device="cuda")
            scale = torch.empty(info["scale_inv_entries"], device="cuda")
            col_scale = (torch.empty(info["columnwise_scale_inv_entries"], device="cuda")
                         if scales != "tensor" else None)
            opfuse.quantize(x, row, scale, col, col_scale, scales=scales, stream=stream)
            decoded = torch.empty_like(x)
            opfuse.dequantize(row, scale, decoded, [200, 384], scales=scales, stream=stream)
            self.assertLessEqual(relative_error(decoded, x), 0.05, scales)
            decoded_t = torch.empty(384, 200, dtype=torch.bfloat16, device="cuda")
            opfuse.dequantize(col, scale if col_scale is None else col_scale, decoded_t,
                              [200, 384], scales=scales, columnwise=True, stream=stream)
            if scales != "block_1x128":  # the same blocks both ways: the same values
                self.assertTrue(bits_equal(decoded_t.t().contiguous(), decoded), scales)
            self.assertLessEqual(relative_error(decoded_t.t(), x), 0.05, scales)
        with self.assertRaisesRegex(opfuse.UsageError, "smaller than the block_1x128 layout needs"):
            opfuse.quantize(x, row, torch.empty(1, device="cuda"), scales="block_1x128",
                            stream=stream)

    def test_micro_layouts_round_trip_and_decode_as_written(self) -> None:
        # mxfp8_1x32 and nvfp4_1x16 through quantize and dequantize: each copy decodes to the
        # rules of runtime/cpu/micro_scaling.h written out here in torch, rounded to bf16, and
        # lands near x (the NVFP4 column-wise copy near x transposed, Hadamard-transformed or not).
        stream = torch.cuda.current_stream().cuda_stream
        rows, cols = 256, 512
        x = (torch.randn(rows, cols, device="cuda") * 3).bfloat16()

        def cuda_bytes(n: int) -> torch.Tensor:
            return torch.empty(n, dtype=torch.uint8, device="cuda")

        def e4m3(codes: torch.Tensor) -> torch.Tensor:
            return codes.view(torch.float8_e4m3fn).float()

        # MXFP8: fp8(code) * 2^(e - 127), both copies [rows, cols]; the row-wise scales are
        # [rows][cols / 32], the column-wise ones [rows / 32][cols].
        info = opfuse.quantized_tensor_info([rows, cols], "mxfp8_1x32")
        self.assertEqual((info["format"], info["scale_entry_bytes"], info["tensor_scales"]),
                         ("e4m3", 1, False))
        self.assertEqual((info["rowwise_bytes"], info["columnwise_bytes"]),
                         (rows * cols, rows * cols))
        self.assertEqual((info["scale_grid"], info["columnwise_scale_grid"]),
                         ([rows, cols // 32], [rows // 32, cols]))
        row = torch.empty(rows, cols, dtype=torch.uint8, device="cuda")
        col = torch.empty(rows, cols, dtype=torch.uint8, device="cuda")
        scale = cuda_bytes(info["scale_inv_entries"])
        col_scale = cuda_bytes(info["columnwise_scale_inv_entries"])
        opfuse.quantize(x, row, scale, col, col_scale, scales="mxfp8_1x32", stream=stream)
        # 2^(e - 127) exactly: e as a float32's exponent bits (a cast makes e = 0 only for a
        # block of zeros, whose codes decode to 0 either way, and never e = 255).
        powers = (scale.int() << 23).view(torch.float32).view(rows, cols // 32)
        col_powers = (col_scale.int() << 23).view(torch.float32).view(rows // 32, cols)
        want = (e4m3(row) * powers.repeat_interleave(32, dim=1)).bfloat16()
        want_col = (e4m3(col) * col_powers.repeat_interleave(32, dim=0)).bfloat16()
        decoded = torch.empty_like(x)
        opfuse.dequantize(row, scale, decoded, [rows, cols], scales="mxfp8_1x32", stream=stream)
        decoded_col = torch.empty_like(x)
        opfuse.dequantize(col, col_scale, decoded_col, [rows, cols], scales="mxfp8_1x32",
                          columnwise=True, stream=stream)
        self.assertTrue(torch.equal(decoded, want))
        self.assertTrue(torch.equal(decoded_col, want_col))
        self.assertLess(relative_error(decoded, x), 0.08)
        self.assertLess(relative_error(decoded_col, x), 0.08)
        with self.assertRaisesRegex(opfuse.UsageError, "has no tensor scales"):
            opfuse.quantize(x, row, scale, scales="mxfp8_1x32",
                            tensor_scale=torch.empty(1, device="cuda"), stream=stream)

        # NVFP4: (e2m1(code) * e4m3(s_b)) * (1 / S_enc) in fp32, element 2i in the low nibble of
        # byte i; the row-wise copy [rows, cols], the column-wise one x transposed [cols, rows],
        # each with scales [stored rows][stored cols / 16] and its own S_enc.
        info = opfuse.quantized_tensor_info([rows, cols], "nvfp4_1x16")
        self.assertEqual((info["format"], info["scale_entry_bytes"], info["tensor_scales"]),
                         ("e2m1", 1, True))
        self.assertEqual((info["rowwise_bytes"], info["columnwise_bytes"]),
                         (rows * cols // 2, rows * cols // 2))
        self.assertEqual((info["scale_grid"], info["columnwise_scale_grid"]),
                         ([rows, cols // 16], [cols, rows // 16]))
        magnitudes = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], device="cuda")

        def nvfp4_decode(codes: torch.Tensor, scales: torch.Tensor, s_enc: torch.Tensor,
                         stored: tuple[int, int]) -> torch.Tensor:
            nibbles = torch.stack([codes & 0xF, codes >> 4], dim=-1).view(stored).long()
            values = torch.where(nibbles >= 8, -magnitudes[nibbles & 7], magnitudes[nibbles & 7])
            block = e4m3(scales).view(stored[0], stored[1] // 16).repeat_interleave(16, dim=1)
            s_dec = (torch.ones(1) / s_enc.cpu()).cuda()  # fp32 IEEE division, as the runtime
            return ((values * block) * s_dec).bfloat16()

        # TE's fixed signs (runtime/cpu/micro_scaling.h, kRhtSignMask) and the Sylvester H16:
        # every 16-row group of each column of x replaced by (H16 D / 4) v.
        signs = torch.tensor([-1.0 if 0xD7E8 >> k & 1 else 1.0 for k in range(16)], device="cuda")
        hadamard16 = torch.ones(1, 1, device="cuda")
        for _ in range(4):
            hadamard16 = torch.cat([torch.cat([hadamard16, hadamard16], 1),
                                    torch.cat([hadamard16, -hadamard16], 1)], 0)
        x_t = x.float().t().contiguous()
        x_t_hadamard = ((x_t.view(cols, rows // 16, 16) * signs) @ hadamard16.t() / 4).view(
            cols, rows)

        for hadamard in (False, True):
            row, col = cuda_bytes(info["rowwise_bytes"]), cuda_bytes(info["columnwise_bytes"])
            scale = cuda_bytes(info["scale_inv_entries"])
            col_scale = cuda_bytes(info["columnwise_scale_inv_entries"])
            s_enc, col_s_enc = torch.empty(1, device="cuda"), torch.empty(1, device="cuda")
            opfuse.quantize(x, row, scale, col, col_scale, scales="nvfp4_1x16", stream=stream,
                            tensor_scale=s_enc, columnwise_tensor_scale=col_s_enc,
                            hadamard=hadamard)
            # S_enc = 2688 / amax (448 * 6, current scaling's formula in fp32).
            amax = x.abs().max().float().cpu()
            self.assertEqual(s_enc.item(), (torch.tensor(2688.0) / amax).item())
            if not hadamard:  # the same values, so the same amax
                self.assertEqual(col_s_enc.item(), s_enc.item())
            decoded = torch.empty_like(x)
            opfuse.dequantize(row, scale, decoded, [rows, cols], scales="nvfp4_1x16",
                              format="e2m1", tensor_scale=s_enc, stream=stream)
            decoded_col = torch.empty(cols, rows, dtype=torch.bfloat16, device="cuda")
            opfuse.dequantize(col, col_scale, decoded_col, [rows, cols], scales="nvfp4_1x16",
                              format="e2m1", columnwise=True, tensor_scale=col_s_enc,
                              stream=stream)
            self.assertTrue(torch.equal(decoded, nvfp4_decode(row, scale, s_enc, (rows, cols))))
            self.assertTrue(torch.equal(decoded_col,
                                        nvfp4_decode(col, col_scale, col_s_enc, (cols, rows))),
                            f"hadamard={hadamard}")
            self.assertLess(relative_error(decoded, x), 0.2)
            self.assertLess(relative_error(decoded_col, x_t_hadamard if hadamard else x_t), 0.2,
                            f"hadamard={hadamard}")
        with self.assertRaisesRegex(opfuse.UsageError, "tensor_scale is null"):
            opfuse.quantize(x, row, scale, scales="nvfp4_1x16", stream=stream)
        with self.assertRaisesRegex(opfuse.UsageError, "is e2m1, not e4m3"):
            opfuse.dequantize(row, scale, decoded, [rows, cols], scales="nvfp4_1x16",
                              tensor_scale=s_enc, stream=stream)
        with self.assertRaisesRegex(opfuse.UsageError, "two codes per byte"):
            opfuse.quantize(x, torch.empty(rows, cols, dtype=torch.uint8, device="cuda"), scale,
                            scales="nvfp4_1x16", tensor_scale=s_enc, stream=stream)


if __name__ == "__main__":
    unittest.main(verbosity=2)
