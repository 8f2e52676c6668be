"""The write check: which of a call's output elements were put there by torch copies of input data and left alone by
the DSL kernels, so that allowlisted data movement cannot stand in for the DSL's work.

The profiler says which kernels ran, not which memory they wrote. This check watches torch at the
dispatcher during the untimed verification calls (a `TorchDispatchMode`): every copy-type op (`copy_`,
`_to_copy`, `clone`) whose source is input data (an input's storage, host memory, or memory that still
holds such a copy) is recorded with a snapshot of what it wrote. After the call the recorded writes
are replayed onto a blank image of each output's storage; an output element whose final bits equal
the replayed bits was produced by a copy and not rewritten by a DSL kernel afterwards (DSL kernels
never pass through the dispatcher). Only elements the call produced count: a fresh output's every
element, a mutated input's elements that changed. Casting or laying out a DSL kernel's result copies
memory that is not input data, so it is not recorded; the check fails only when copies of input data
produced more than `MAX_COPIED_FRACTION` of the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# copy-type ops: their kernels are the profiler allowlist's `copy` entries (direct_copy_kernel, Memcpy)
_COPY_OPS = frozenset({"copy_", "_to_copy", "clone", "copy", "_copy_from", "_copy_from_and_resize"})
# more than this share of the produced output elements came straight from copies: integrity_allowlist_work
MAX_COPIED_FRACTION = 0.5
_INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class _Write:
    ptr: int  # the written tensor's storage address
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    snapshot: torch.Tensor  # what the op left there, taken right after it
    keep: torch.Tensor  # the written tensor itself: its storage stays allocated, so no later tensor reuses the address
    from_host: bool = False  # the copy brought host memory onto the device (the answer computed on the CPU)


class CopyWatch(TorchDispatchMode):
    """Records copy-type ops that move input data (test and verification calls only, never timed ones).

    A copy moves input data when its source is an input's storage, host memory, or memory whose content
    is (mostly) still what such a copy put there; a copy of anything else (a DSL kernel's result being
    cast or laid out) is not recorded. Each record keeps a snapshot of what the op wrote.
    """

    def __init__(self, inputs: Sequence[Any] = ()) -> None:
        super().__init__()
        self.writes: list[_Write] = []
        self._input_ptrs = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if name in _COPY_OPS:
            src = args[1] if name == "copy_" and len(args) > 1 else (args[0] if args else None)
            dst = args[1] if name.startswith("_copy_from") and len(args) > 1 else out
            if isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor) and dst.numel() and not _is_meta(dst) \
                    and self._moves_input_data(src, dst):
                self.writes.append(_Write(dst.untyped_storage().data_ptr(), dst.dtype, tuple(dst.size()), tuple(dst.stride()),
                                          dst.storage_offset(), dst.detach().clone(), dst.detach(),
                                          from_host=src.device.type == "cpu" and dst.device.type != "cpu"))
        return out

    def _moves_input_data(self, src: torch.Tensor, dst: torch.Tensor) -> bool:
        if src.device != dst.device:
            return True
        ptr = src.untyped_storage().data_ptr()
        if ptr in self._input_ptrs:
            return True
        if any(w.ptr == ptr for w in self.writes):
            return copy_share([src], self.writes).fraction > MAX_COPIED_FRACTION
        return False


def _is_meta(t: torch.Tensor) -> bool:
    return t.device.type == "meta"


@dataclass(frozen=True)
class CopyShare:
    """How much of the answer copies produced: elements produced by the call, and of those, by copies."""

    produced: int
    copied: int
    from_host: int = 0  # of `copied`, elements whose last recorded write came from host memory

    @property
    def fraction(self) -> float:
        return self.copied / self.produced if self.produced else 0.0

    @property
    def too_much(self) -> bool:
        return self.fraction > MAX_COPIED_FRACTION

    @property
    def reason(self) -> str:
        """integrity_host_compute when most copied elements came from the host, else integrity_allowlist_work."""
        return "integrity_host_compute" if 2 * self.from_host > self.copied else "integrity_allowlist_work"


def _bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s elements as integers of the same width, so that NaN payloads and -0.0 compare by their bits."""
    it = _INT_OF.get(t.element_size())
    if it is None or t.dtype == it:
        return t
    return t.contiguous().view(it)


def copy_share(outputs: Sequence[Any], writes: Sequence[_Write], *, before: dict[int, torch.Tensor] | None = None) -> CopyShare:
    """Replay `writes` onto a blank image of every output's storage and count the output elements they explain.

    `before` maps an output's index to its content before the call (mutated inputs): only its elements
    that changed were produced by the call.
    """
    produced = copied = host = 0
    for i, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor) or not out.numel():
            continue
        ptr = out.untyped_storage().data_ptr()
        mine = [w for w in writes if w.ptr == ptr and w.dtype == out.dtype]
        with torch.no_grad():
            final = out.detach()
            changed = None
            if i in (before or {}):
                changed = (_bits(final) != _bits(before[i])).reshape(-1)
            n_prod = int(changed.sum()) if changed is not None else final.numel()
            produced += n_prod
            if not mine or not n_prod:
                continue
            n_elem = out.untyped_storage().nbytes() // out.element_size()
            image = torch.zeros(n_elem, dtype=out.dtype, device=out.device)
            mask = torch.zeros(n_elem, dtype=torch.bool, device=out.device)
            hosted = torch.zeros(n_elem, dtype=torch.bool, device=out.device)
            for w in mine:
                try:
                    image.as_strided(w.size, w.stride, w.offset).copy_(w.snapshot)
                    mask.as_strided(w.size, w.stride, w.offset).fill_(True)
                    hosted.as_strided(w.size, w.stride, w.offset).fill_(w.from_host)
                except RuntimeError:  # a view this image cannot hold (beyond the storage): not counted
                    continue
            img = image.as_strided(final.size(), final.stride(), final.storage_offset())
            hit = mask.as_strided(final.size(), final.stride(), final.storage_offset())
            same = (hit & (_bits(img) == _bits(final))).reshape(-1)
            if changed is not None:
                same = same & changed
            copied += int(same.sum())
            host += int((same & hosted.as_strided(final.size(), final.stride(), final.storage_offset()).reshape(-1)).sum())
    return CopyShare(produced, copied, host)


def warm_up() -> None:
    """Enter and leave a watch once. The first dispatch mode imports torch._dynamo, which rebinds
    `torch.manual_seed` and friends: done before the guard's snapshot, so the rebinding is not the candidate's."""
    with CopyWatch():
        torch.zeros(2).clone()
