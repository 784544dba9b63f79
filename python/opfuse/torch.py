"""opfuse sequences as PyTorch modules: `opfuse.torch.Sequential(program, sequence, **sizes)`.

A torch.nn.Module whose parameters are torch.nn.Parameters (named as in the .fuse program:
`fc1.weight`), whose forward is a torch.autograd.Function running the session's forward and
backward on the current torch stream, and whose quantizer state travels in state_dict() as extra
state (as TE's modules keep their FP8 metadata). Like TE's fuser, forward takes the sequence's
inputs (the main one first, then the extra inputs) and returns its main output, or a tuple with
the extra outputs after it. docs/python.md has the whole story.

This module imports torch; `import opfuse` does not.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from . import CudaError, Error, Program, RunMode, Session, SessionOptions, StateParts, TensorDType
from . import TensorInfo, TensorKind, UsageError

# The per-call work in C++ (python/src/torch_module.cpp), where the package was built against
# this interpreter's torch, and only under the torch version it was built against (torch's C++
# ABI changes between releases); OPFUSE_TORCH_NATIVE=0 keeps the Python path (docs/python.md).
_native: Any
try:
    if os.environ.get("OPFUSE_TORCH_NATIVE", "1") == "0":
        raise ImportError("OPFUSE_TORCH_NATIVE=0")
    from . import _opfuse_torch as _native  # type: ignore[attr-defined,no-redef]
except ImportError:
    _native = None
if _native is not None and _native.torch_version != torch.__version__:
    warnings.warn(f"opfuse.torch: the package's C++ path was built against torch "
                  f"{_native.torch_version}, this is torch {torch.__version__}: using the Python "
                  f"path (rebuild the package: pip install --no-build-isolation .)", stacklevel=2)
    _native = None

__all__ = ["Sequential", "torch_dtype"]

# The current CUDA stream of a device as an int: torch's raw accessor where it has one (a
# torch.cuda.Stream object per call costs microseconds on every forward), else the public way.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


# What every call checks of a tensor: name, torch.Size, torch dtype, and the TensorInfo.
_Spec = Tuple[str, torch.Size, torch.dtype, TensorInfo]
_TRAINING = RunMode.TRAINING
_INFERENCE = RunMode.INFERENCE


def _current_raw_stream(device_index: int) -> int:
    if _raw_stream is not None:
        return int(_raw_stream(device_index))
    return int(torch.cuda.current_stream(device_index).cuda_stream)


_TORCH_DTYPES = {
    TensorDType.BF16: torch.bfloat16,
    TensorDType.FP16: torch.float16,
    TensorDType.FP32: torch.float32,
}


_DTYPE_NAMES = {TensorDType.BF16: "bf16", TensorDType.FP16: "fp16", TensorDType.FP32: "fp32"}


def torch_dtype(dtype: TensorDType) -> torch.dtype:
    """The torch dtype of a tensor dtype (bf16, fp16, fp32)."""
    return _TORCH_DTYPES[dtype]


class _SequenceFunction(torch.autograd.Function):
    """One forward (and its backward) of the module's session, on the current stream."""

    @staticmethod
    def forward(ctx: Any, module: "Sequential", *tensors: torch.Tensor) -> Any:
        inputs = tensors[:len(module._inputs)]
        outputs = module._run_forward(inputs, training=True)
        ctx.module = module
        ctx.forward_id = module._counts[0]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        module: Sequential = ctx.module
        if ctx.forward_id != module._counts[0]:
            raise UsageError(
                "opfuse.torch.Sequential: backward of an earlier forward; the session keeps the "
                "saved activations of its last training forward only, so run each forward's "
                "backward before the next forward")
        input_grads, param_grads = module._run_backward(grads)
        return (None, *input_grads, *param_grads)


class Sequential(torch.nn.Module):
    """A sequence of a compiled program as a torch.nn.Module on the current CUDA device.

    program: an opfuse.Program (opfuse.compile); sequence: its name (None: the only one);
    sizes: every symbolic size (tokens=4096), fixed until bind(). Parameters start as
    Session.own_parameters(seed) draws them (linear weights ~ N(0, 0.02), norm weights 1,
    biases 0), or load them with load_state_dict(). options: SessionOptions.

    forward(x, *extra_inputs) takes CUDA tensors of the inputs' dtypes and shapes, dense and
    row-major, and refuses others (UsageError) before anything runs. Under torch.no_grad() it
    runs an inference forward. After the optimizer changes the parameters call step() (or
    register it with register_optimizer()): it ends the step (the quantizers' amax history and
    scales are updated in one launch) and recasts the FP8 weights at the next forward.
    Parameters changed in place without step() are noticed too (their version counters) and
    recast, but the quantizers then keep their scales.
    """

    def __init__(self, program: Program, sequence: Optional[str] = None, *, seed: int = 0,
                 options: Optional[SessionOptions] = None, **sizes: int) -> None:
        super().__init__()
        if not torch.cuda.is_available():
            raise UsageError("opfuse.torch.Sequential runs on a CUDA GPU and torch sees none; "
                             "the CPU reference runs through program.session(device='cpu')")
        self._device = torch.device("cuda", torch.cuda.current_device())
        self._device_index = self._device.index
        stream = torch.cuda.current_stream(self._device).cuda_stream
        self._session: Session = program.session(sequence, device="cuda", stream=stream,
                                                 options=options, **sizes)
        # Inputs and outputs in signature order (tensors() lists outputs by name); a program
        # from load_build() has no source to say it: tensors()' order then.
        try:
            self._signature: Optional[Tuple[List[str], List[str]]] = program.signature(sequence)
        except UsageError:
            self._signature = None
        self._describe(self._session.tensors())
        # Initial values: a session of their own draws them (own_parameters), the module keeps
        # copies as Parameters and gives those to its session.
        drawn: Session = program.session(sequence, device="cuda", stream=stream, **sizes)
        drawn.own_parameters(seed, stream)
        for info in self._params:
            value = torch.from_dlpack(drawn.parameter(info.name)).clone()
            self._parameter_owner(info.name).register_parameter(
                info.name.rsplit(".", 1)[-1], torch.nn.Parameter(value))
        torch.cuda.current_stream(self._device).synchronize()  # `drawn` goes away
        del drawn
        self._param_versions: Dict[str, Tuple[int, int]] = {}
        # [forwards run]: a list mutated in place (torch.nn.Module.__setattr__ costs microseconds
        # on every assignment to an attribute of the module).
        self._counts = [0]
        self._find_parameter_slots()
        self._given: Dict[str, int] = {}  # the address the session has for each input/gradient
        self._kept: Dict[str, torch.Tensor] = {}  # what it reads there, kept alive
        self._runner: Any = None
        self._make_runner()

    # --- the interface ---------------------------------------------------------------------

    def _describe(self, tensors: List[TensorInfo]) -> None:
        def of(kind: TensorKind) -> List[TensorInfo]:
            return [t for t in tensors if t.kind == kind]

        self._inputs = of(TensorKind.INPUT)
        self._outputs = of(TensorKind.OUTPUT)
        if self._signature is not None:
            inputs, outputs = self._signature
            self._inputs.sort(key=lambda t: inputs.index(t.name))
            self._outputs.sort(key=lambda t: outputs.index(t.name))
        # One gradient per output, in the outputs' order ("dy" for "y").
        grads = {t.name: t for t in of(TensorKind.OUTPUT_GRAD)}
        self._output_grads = [grads["d" + t.name] for t in self._outputs]
        self._params = of(TensorKind.PARAM)
        self._input_grad_names = {t.name for t in of(TensorKind.INPUT_GRAD)}
        # What every call checks, as plain Python values (a TensorInfo field read through the
        # binding builds a new object each time): name, torch.Size, torch dtype, the info.
        self._input_specs = [self._spec(t) for t in self._inputs]
        self._grad_specs = [self._spec(t) for t in self._output_grads]
        self._param_specs = [self._spec(t) for t in self._params]
        self._output_names = [t.name for t in self._outputs]
        self._input_names = [t.name for t in self._inputs]
        self._param_names = [t.name for t in self._params]
        # Torch views of session memory by (kind, name, address): made once, cloned per call.
        self._views: Dict[Tuple[str, str, int], torch.Tensor] = {}

    @staticmethod
    def _spec(info: TensorInfo) -> _Spec:
        return (info.name, torch.Size(info.shape), torch_dtype(info.dtype), info)

    def _parameter_owner(self, name: str) -> torch.nn.Module:
        # "fc1.weight" lives in a child module "fc1", so state_dict() keys are the .fuse names.
        owner: torch.nn.Module = self
        for part in name.split(".")[:-1]:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        return owner

    def _find_parameter_slots(self) -> None:
        # Per parameter (the program's order): its spec and the owner module's own table with the
        # key there, read on every call (not get_parameter()'s walk): a Parameter assigned anew
        # to the owner is seen.
        self._param_slots: List[Tuple[_Spec, Dict[str, Any], str]] = []
        for spec in self._param_specs:
            owner, _, leaf = spec[0].rpartition(".")
            module = self.get_submodule(owner) if owner else self
            self._param_slots.append((spec, module._parameters, leaf))

    def _make_runner(self) -> None:
        """The C++ runner of every call (torch_module.cpp) over this module's specs and parameter
        tables, where the package has it; None keeps the Python path."""
        if _native is None:
            self._runner = None
            return

        def spec(info: TensorInfo) -> Tuple[str, List[int], str]:
            return (info.name, list(info.shape), _DTYPE_NAMES[info.dtype])

        self._runner = _native.Runner(
            self._session, self._session._native(), self._device_index,
            [spec(t) for t in self._inputs],
            [t.name in self._input_grad_names for t in self._inputs],
            [(table, leaf, spec(s[3])) for s, table, leaf in self._param_slots],
            [spec(t) for t in self._outputs], [t.name for t in self._output_grads],
            UsageError, CudaError, Error)

    @property
    def native(self) -> bool:
        """Whether calls run through the C++ runner (the package built against this torch)."""
        return self._runner is not None

    @property
    def session(self) -> Session:
        """The opfuse.Session the module runs (quantizers(), memory(), ...)."""
        return self._session

    def tensors(self) -> List[TensorInfo]:
        return self._session.tensors()

    @property
    def input_names(self) -> List[str]:
        """What forward() takes, in order: the main input, then the extra inputs."""
        return [t.name for t in self._inputs]

    @property
    def output_names(self) -> List[str]:
        """What forward() returns, in order: the main output, then the extra outputs."""
        return [t.name for t in self._outputs]

    def bind(self, **sizes: int) -> None:
        """Binds the symbolic sizes again (new input shapes); parameters keep their values."""
        self._session.bind(sizes)
        self._describe(self._session.tensors())
        self._find_parameter_slots()
        self._given.clear()
        self._make_runner()

    # --- checks ----------------------------------------------------------------------------

    def _check(self, tensor: object, spec: _Spec, what: str) -> torch.Tensor:
        name, shape, dtype, _ = spec
        # The common case in one expression; the messages only when something does not fit.
        if (isinstance(tensor, torch.Tensor) and tensor.dtype is dtype and tensor.shape == shape
                and tensor.is_cuda and tensor.get_device() == self._device_index
                and tensor.is_contiguous()):
            return tensor
        where = f"opfuse.torch.Sequential({self._session.sequence}): {what} '{name}'"
        if not isinstance(tensor, torch.Tensor):
            raise UsageError(f"{where}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype != dtype:
            raise UsageError(f"{where} is {dtype}, the tensor is {tensor.dtype}")
        if tensor.device != self._device:
            raise UsageError(f"{where}: the tensor is on {tensor.device}, the module on "
                             f"{self._device}")
        if tensor.shape != shape:
            raise UsageError(f"{where} has shape {list(shape)}, the tensor "
                             f"{list(tensor.shape)} (bind() other sizes)")
        raise UsageError(f"{where}: the tensor is not dense and row-major (strides "
                         f"{tensor.stride()}); pass tensor.contiguous()")

    # --- running ---------------------------------------------------------------------------

    def _stream(self) -> int:
        return int(_current_raw_stream(self._device_index))

    def _give_parameters(self) -> None:
        """Each parameter given to the session if it moved; one written in place since the last
        forward (its version counter) is recast."""
        if self._runner is not None:
            # The runner has been giving the parameters: give each one again here, and the
            # runner gives them again at its next call.
            self._runner.forget()
            self._param_versions.clear()
        changed = False
        versions = self._param_versions
        for spec, table, leaf in self._param_slots:
            param = table[leaf]
            name = spec[0]
            key = (param.data_ptr(), param._version)
            seen = versions.get(name)
            if seen == key:
                continue
            if seen is None or seen[0] != key[0]:
                self._session.set_tensor(name, self._check(param, spec, "parameter").detach())
            else:
                changed = True  # written in place since the last forward
            versions[name] = key
        if changed:
            self._session.parameters_changed()

    def _give(self, key: str, tensor: torch.Tensor, name: Optional[str] = None) -> None:
        # The session reads a tensor where set_tensor() pointed it: a tensor at the address it
        # already has (the same tensor again, or a new one in its memory) needs no call, which
        # saves the DLPack exchange. The module keeps the tensor alive until the next one.
        pointer = tensor.data_ptr()
        if self._given.get(key) != pointer:
            self._session.set_tensor(name or key, tensor.detach())
            self._given[key] = pointer
        self._kept[key] = tensor

    def _copy_of(self, what: str, name: str) -> torch.Tensor:
        """A copy of output(name), input_grad(name) or param_grad(name): the torch view of that
        address is made once (the session's memory stays where it is until bind())."""
        key = (what, name, self._session._address(what, name))
        view = self._views.get(key)
        if view is None:
            view = torch.from_dlpack(getattr(self._session, what)(name))
            self._views[key] = view
        return view.clone()

    def _check_count(self, inputs: Tuple[object, ...]) -> None:
        if len(inputs) != len(self._input_specs):
            names = ", ".join(self._input_names)
            raise UsageError(f"opfuse.torch.Sequential({self._session.sequence}) takes "
                             f"{len(self._input_specs)} inputs ({names}), got {len(inputs)}")

    def _run_forward(self, inputs: Tuple[torch.Tensor, ...], training: bool) -> List[torch.Tensor]:
        checked = [self._check(x, spec, "input") for x, spec in zip(inputs, self._input_specs)]
        self._give_parameters()
        for x, name in zip(checked, self._input_names):
            self._give(name, x)
        self._session.forward(self._stream(), _TRAINING if training else _INFERENCE)
        self._counts[0] += 1
        # Views of the session's memory, valid until its next forward: copies for autograd.
        return [self._copy_of("output", name) for name in self._output_names]

    def _run_backward(self, grads: Tuple[torch.Tensor, ...]) -> Tuple[List[Optional[torch.Tensor]],
                                                                      List[torch.Tensor]]:
        for grad, spec in zip(grads, self._grad_specs):
            self._give("grad:" + spec[0], self._check(grad.contiguous(), spec, "output gradient"),
                       spec[0])
        self._session.backward(self._stream())
        input_grads: List[Optional[torch.Tensor]] = [
            self._copy_of("input_grad", name) if name in self._input_grad_names else None
            for name in self._input_names]
        param_grads = [self._copy_of("param_grad", name) for name in self._param_names]
        return input_grads, param_grads

    def forward(self, *inputs: torch.Tensor) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
        runner = self._runner
        if runner is not None:
            # The whole call in C++; None when a tensor does not fit: the Python path below
            # then reports it.
            native: Union[None, torch.Tensor, Tuple[torch.Tensor, ...]] = runner(inputs)
            if native is not None:
                return native
            self._given.clear()  # the runner gave the inputs: the Python path gives them again
        # Here, not in _run_forward: autograd's apply passes any count on, and once is enough.
        self._check_count(inputs)
        if torch.is_grad_enabled():
            params = [table[leaf] for _, table, leaf in self._param_slots]
            result: Union[torch.Tensor, Tuple[torch.Tensor, ...]] = _SequenceFunction.apply(
                self, *inputs, *params)
            return result
        outputs = self._run_forward(tuple(inputs), training=False)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def step(self) -> None:
        """Ends a training step after the optimizer's: the quantizers updated in one launch on
        the current stream, the FP8 weights recast at the next forward."""
        self._session.step(self._stream())
        self._session.parameters_changed()
        for spec, table, leaf in self._param_slots:
            param = table[leaf]
            seen = self._param_versions.get(spec[0])
            if seen is not None and seen[0] == param.data_ptr():  # a moved one: given next call
                self._param_versions[spec[0]] = (param.data_ptr(), param._version)
        if self._runner is not None:
            self._runner.mark_parameters_seen([table[leaf] for _, table, leaf in self._param_slots])

    def register_optimizer(self, optimizer: torch.optim.Optimizer) -> Any:
        """Calls step() after every optimizer.step(); returns the hook's handle."""
        return optimizer.register_step_post_hook(lambda *_: self.step())

    # --- checkpoints: the quantizer state as extra state -----------------------------------

    def get_extra_state(self) -> torch.Tensor:
        """The session's quantizer state and step count (a state file of StateParts.QUANTIZERS,
        docs/state_files.md; the parameters are the state dict's own entries) as bytes in a uint8
        tensor; set_extra_state() loads it after the parameters."""
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "state.opfuse")
            self._session.save(path, self._stream(), StateParts.QUANTIZERS)
            with open(path, "rb") as f:
                data = f.read()
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise UsageError("opfuse.torch.Sequential: the extra state is a uint8 tensor of a "
                             "state file (get_extra_state)")
        self._give_parameters()
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "state.opfuse")
            with open(path, "wb") as f:
                f.write(state.cpu().numpy().tobytes())
            # The quantizer state alone (also from a whole checkpoint): the parameters are the
            # ones load_state_dict() has just copied in.
            self._session.load(path, self._stream(), StateParts.QUANTIZERS)
        self._session.parameters_changed()

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{t.name}: {list(t.shape)}" for t in self._inputs)
        return f"sequence={self._session.sequence!r}, inputs=({sizes})"
