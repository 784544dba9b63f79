"""The type of the arrays a GPU Session takes and gives: anything with DLPack's `__dlpack__`
(torch.Tensor, cupy and jax arrays; the views Session.output() returns)."""

from __future__ import annotations

from typing import Any, Protocol


class SupportsDLPack(Protocol):
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...
