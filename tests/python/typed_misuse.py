"""Misuses the stubs must catch: `mypy --strict` must report an error on exactly the lines
with an error comment (python_package_cpu). Never run, only checked."""

from __future__ import annotations

import opfuse

program = opfuse.compile("mlp.fuse")
cpu = program.session(device="cpu", tokens=16)
cpu.forward(mode="training")  # error: a RunMode, not a string
cpu.output(3)  # error: a name, not an int
gpu: opfuse.Session = program.session(device="cpu", tokens=16)  # error: a ReferenceSession
count: int = program.sequences  # error: a list of names
opfuse.compile("mlp.fuse", recipe=8)  # error: a recipe name
