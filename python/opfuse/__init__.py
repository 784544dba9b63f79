"""opfuse from Python: compile a .fuse program, run its sequences on the GPU or the CPU reference.

    import opfuse
    program = opfuse.compile("dsl_examples/mlp.fuse")
    session = program.session("mlp", device="cuda", tokens=4096)   # or device="cpu" (NumPy)
    session.own_parameters(seed=0)
    session.set_tensor("x", x)          # any DLPack CUDA array (torch, cupy, jax), no copy
    session.forward()
    y = torch.from_dlpack(session.output("y"))

`opfuse.torch.Sequential` wraps a session as a torch.nn.Module with autograd (imported on use:
the package itself needs only NumPy). docs/python.md has the whole story; the C++ API it binds is
runtime/include/opfuse/program.h (docs/embedding.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Optional, Sequence, Union, overload

# The kernel templates NVRTC includes ship inside the package (python/CMakeLists.txt); an
# OPFUSE_TEMPLATES_DIR the user set wins.
_TEMPLATES = Path(__file__).resolve().parent / "templates"
if _TEMPLATES.is_dir():
    os.environ.setdefault("OPFUSE_TEMPLATES_DIR", str(_TEMPLATES))

from ._opfuse import (  # noqa: E402  (after the environment is set)
    BlockSummaryStatus,
    BuildStats,
    FusionDeclaration,
    CompileError,
    CompileOptions,
    ContextFaultError,
    CudaError,
    DebugSessionOptions,
    DebugStat,
    Error,
    GraphScope,
    JitError,
    MemoryStats,
    ParallelOptions,
    QuantizerStatus,
    ReferenceSession,
    RunMode,
    Session,
    SessionOptions,
    StateFileError,
    StateParts,
    TensorDType,
    TensorInfo,
    TensorKind,
    UsageError,
    dequantize,
    new_parallel_id,
    quantize,
    quantized_tensor_info,
    reference_input,
    version,
)
from ._dlpack import SupportsDLPack
from ._opfuse import Program as _Program
from ._opfuse import gpu_available as _gpu_available

__all__ = [
    "BlockSummaryStatus", "BuildStats", "CompileError", "CompileOptions", "ContextFaultError",
    "CudaError", "DebugSessionOptions", "DebugStat", "Error", "FusionDeclaration", "GraphScope",
    "JitError",
    "MemoryStats", "ParallelOptions", "Program", "QuantizerStatus", "ReferenceSession", "RunMode",
    "Session", "SessionOptions", "StateFileError", "StateParts", "TensorDType", "TensorInfo", "TensorKind",
    "SupportsDLPack", "UsageError", "compile", "dequantize", "gpu_available", "load_build", "new_parallel_id",
    "quantize", "quantized_tensor_info", "reference_input", "version",
]

PathLike = Union[str, "os.PathLike[str]"]


def gpu_available() -> bool:
    """Whether a CUDA GPU and driver are usable here (gpu_unavailable_reason() says why not)."""
    return bool(_gpu_available()[0])


def gpu_unavailable_reason() -> str:
    """What is missing for the GPU; empty when there is one."""
    return str(_gpu_available()[1])


def _is_source(path_or_source: PathLike) -> bool:
    # Text has a newline (a program is at least a few lines); a path has none.
    return isinstance(path_or_source, str) and "\n" in path_or_source


class Program:
    """A compiled .fuse program: every sequence's plan and its kernels' binaries.

    Made by compile() or load_build(). Immutable; many sessions may share one. session() runs a
    sequence on the GPU (Session) or on the CPU reference executor (ReferenceSession).
    """

    def __init__(self, compiled: _Program) -> None:
        self._compiled = compiled

    @property
    def sequences(self) -> list[str]:
        """The program's sequence names."""
        return list(self._compiled.sequences)

    @property
    def arch(self) -> str:
        """The NVRTC target the kernels were compiled for ('sm_90a')."""
        return self._compiled.arch

    @property
    def name(self) -> str:
        """The file (or the name given to the text) it was compiled from."""
        return self._compiled.name

    def recipe(self, sequence: str = "") -> str:
        """The recipe a sequence compiled with, e.g. 'delayed_scaling(format = hybrid, ...)'."""
        return self._compiled.recipe(sequence)

    @property
    def plan_json(self) -> str:
        """The plan as JSON (docs/codegen.md)."""
        return self._compiled.plan_json

    @property
    def build_stats(self) -> BuildStats:
        """Kernels compiled, cache hits and compile time."""
        return self._compiled.build_stats

    @property
    def warnings(self) -> str:
        """The compile's warnings, formatted like errors; empty when there were none."""
        return self._compiled.warnings

    @property
    def has_debug_config(self) -> bool:
        return self._compiled.has_debug_config

    def signature(self, sequence: Optional[str] = None) -> tuple[list[str], list[str]]:
        """A sequence's input and output names in signature order, the main one first.

        Session.tensors() lists outputs by name; this is the order the .fuse program declares.
        UsageError for a program from load_build() (it holds no .fuse source).
        """
        inputs, outputs = self._compiled.signature(sequence or "")
        return list(inputs), list(outputs)

    @overload
    def session(self, sequence: Optional[str] = None, *, device: Literal["cuda"],
                stream: object = None, options: Optional[SessionOptions] = None,
                **sizes: int) -> Session: ...

    @overload
    def session(self, sequence: Optional[str] = None, *, device: Literal["cpu"],
                stream: object = None, options: Optional[SessionOptions] = None,
                **sizes: int) -> ReferenceSession: ...

    @overload
    def session(self, sequence: Optional[str] = None, *, device: str = "auto",
                stream: object = None, options: Optional[SessionOptions] = None,
                **sizes: int) -> Union[Session, ReferenceSession]: ...

    def session(self, sequence: Optional[str] = None, *, device: str = "auto",
                stream: object = None, options: Optional[SessionOptions] = None,
                **sizes: int) -> Union[Session, ReferenceSession]:
        """A session of `sequence` (None: the program's only one), bound to `sizes`.

        device='cuda': a Session on the current CUDA device (UsageError without a GPU), taking
        DLPack CUDA arrays; device='cpu': a ReferenceSession on the CPU reference executor,
        taking NumPy float32 arrays; 'auto': the GPU when there is one. Every symbolic size of
        the sequence is a keyword (tokens=4096). `options` (SessionOptions) are the GPU's.
        """
        if device not in ("auto", "cuda", "cpu"):
            raise UsageError(f"device must be 'auto', 'cuda' or 'cpu', not {device!r}")
        for size_name, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int):
                raise UsageError(
                    f"size {size_name}={size!r}: sizes are ints (the symbolic sizes of the sequence)"
                )
        if device == "auto":
            device = "cuda" if gpu_available() else "cpu"
        if device == "cpu":
            if options is not None:
                raise UsageError("options (SessionOptions) are the GPU session's; the CPU session "
                                 "takes none")
            return ReferenceSession(self._compiled, sequence or "", dict(sizes))
        return Session(self._compiled, sequence or "", dict(sizes), stream,
                       options if options is not None else SessionOptions())

    def __repr__(self) -> str:
        return f"Program({self.name!r}, sequences={self.sequences}, arch={self.arch!r})"


def compile(path_or_source: PathLike, *, recipe: Optional[str] = None,
            arch: Optional[str] = None, debug_config: Optional[PathLike] = None,
            name: str = "<string>.fuse", cache_dir: Optional[PathLike] = None,
            use_cache: bool = True, disabled_passes: Sequence[str] = (),
            fp8_fprop_fast_accum: bool = True, fp8_backward_fast_accum: bool = False,
            compile_threads: int = 0, emulate_block_scaling: bool = False,
            fusions: Sequence[FusionDeclaration] = ()) -> Program:
    """Compiles a .fuse program (a path, or its text: a string with a newline) for the GPU.

    recipe: a recipe declared in the file or 'bf16' for every sequence (None: each its own).
    arch: the NVRTC target ('sm_90a'; None: the current GPU's, or sm_90a without one); no GPU
    is needed to compile. debug_config: a precision-debug config (TE's config.yaml schema), a
    path or YAML text (docs/debugging.md). `name` is the file name diagnostics show for text.
    Kernels are cached on disk (cache_dir, else $OPFUSE_CACHE_DIR, else ~/.cache/opfuse).
    emulate_block_scaling: run float8_block_scaling emulated on sm_90a too (block-quantized
    copies decoded to BF16, BF16 GEMMs), to compare with the native block-scaled GEMMs.
    fusions: fusion patterns beside the program's own `fusion` declarations, e.g.
    FusionDeclaration("axpy", ["constant_scale", "add_extra_input"]) (TE's ForwardAxpy), each
    checked as the declaration `fusion axpy(phase = forward, priority = 1) { ... }` would be.

    Raises CompileError with every diagnostic, located (`file:line:col: error: ...`, the line
    and a caret), for a program with errors; UsageError for bad options; JitError when NVRTC
    rejects a kernel.
    """
    options = CompileOptions()
    options.recipe = recipe or ""
    options.arch = arch or ""
    options.cache_dir = os.fspath(cache_dir) if cache_dir is not None else ""
    options.use_cache = use_cache
    options.disabled_passes = list(disabled_passes)
    options.fp8_fprop_fast_accum = fp8_fprop_fast_accum
    options.fp8_backward_fast_accum = fp8_backward_fast_accum
    options.compile_threads = compile_threads
    options.emulate_block_scaling = emulate_block_scaling
    options.fusions = list(fusions)
    config_path: Optional[str] = None
    config_text: Optional[str] = None
    if debug_config is not None:
        if _is_source(debug_config):
            config_text = str(debug_config)
        else:
            config_path = os.fspath(debug_config)
    if _is_source(path_or_source):
        compiled = _Program.compile_source(str(path_or_source), name, options, config_path,
                                           config_text)
    else:
        path = os.fspath(path_or_source)
        if not os.path.isfile(path):
            raise UsageError(f"{path}: no such file (opfuse.compile takes a .fuse file's path, "
                             "or the program's text: a string with a newline)")
        compiled = _Program.compile_file(path, options, config_path, config_text)
    return Program(compiled)


def load_build(directory: PathLike) -> Program:
    """A `fusec build FILE -o DIR` output (plan and kernel binaries, verified; no NVRTC).

    GPU sessions only: it holds no .fuse source for the CPU reference.
    """
    return Program(_Program.load_build(os.fspath(directory)))


def __getattr__(attribute: str) -> object:
    # `opfuse.torch` imports torch: only when asked for.
    if attribute == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'opfuse' has no attribute {attribute!r}")
