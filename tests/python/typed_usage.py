"""A typed use of the package: `mypy --strict` must accept it against the installed stubs
(python_package_cpu). Never run, only checked."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import opfuse


def train_on_cpu(path: str, tokens: int, steps: int) -> list[float]:
    program: opfuse.Program = opfuse.compile(path, recipe="bf16", arch="sm_90a")
    session: opfuse.ReferenceSession = program.session("mlp", device="cpu", tokens=tokens)
    session.own_parameters(seed=0)
    infos: list[opfuse.TensorInfo] = session.tensors()
    x: npt.NDArray[np.float32] = opfuse.reference_input(infos[0].shape, 0, 0)
    session.set_tensor("x", x)
    losses: list[float] = []
    for _ in range(steps):
        session.forward(mode=opfuse.RunMode.TRAINING)
        y = session.output("y")
        losses.append(float(np.mean(y * y)))
        session.set_tensor("dy", y / y.size)
        session.backward()
        grad = session.param_grad("fc1.weight")
        session.step()
        session.set_tensor("fc1.weight", session.parameter("fc1.weight") - 0.01 * grad)
    statuses: list[opfuse.QuantizerStatus] = session.quantizers()
    scales: list[float] = [q.scale for q in statuses]
    return losses + scales


def run_on_gpu(program: opfuse.Program, stream: int) -> opfuse.MemoryStats:
    options = opfuse.SessionOptions()
    options.auto_graph = False
    session: opfuse.Session = program.session(device="cuda", stream=stream, options=options,
                                              tokens=64)
    session.own_parameters(0, stream)
    session.capture(stream, opfuse.GraphScope.TRAINING_STEP)
    session.replay(stream)
    session.release_graph()
    session.save("state.bin", stream)
    session.load("state.bin", stream)
    either: opfuse.Session | opfuse.ReferenceSession = program.session(tokens=64)
    print(either.device, opfuse.gpu_available(), opfuse.version())
    try:
        opfuse.compile("bad.fuse")
    except opfuse.CompileError as error:
        print(str(error))
    return session.memory()
