# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""A handoff between two GEMV launches: the second starts on the parts of its input the first has written.

Under programmatic dependent launch a kernel waits for the whole kernel before it (``pdl_enter``).
Between a gate_up GEMV and the down GEMV that reads its output that costs the first one's tail:
its last programs run while the second one's programs sit placed, their first weights loaded,
waiting for all of it. With a handoff the producer counts the columns it has written in chunks of
``Handoff.cols`` (one counter a chunk, a release after its stores), and the consumer waits, before
each loop step, only for the chunks that step reads (an acquire), so most of its steps run while
the producer's last programs still do.

The rules that keep it safe, each enforced here or by ``kernels.int4_matmul.int4_mlp``:

- both launches agree: the producer signals exactly when the consumer waits (one function makes
  both launches), else a consumer spins forever or a counter is left raised;
- the consumer is launched only once every producer program has started (the producer lets its
  dependents launch after its own wait), so every chunk it waits for is being made;
- the consumer writes nothing before its first acquire, and calls the PDL wait at its end, so it
  cannot finish before the producer has (the kernels after it rely on finishing in order);
- the consumer's last program to finish puts every counter back to zero for the next pair (the
  next producer starts only after this consumer has finished).

Owns ``Handoff``, its counters and the Triton helpers the two kernels call. Does not own the
matmuls nor their configs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels._common import tl, triton

_BUFFERS: dict[torch.device, torch.Tensor] = {}
_ENABLED = {"on": True}
PROBE = {"sem": 0}


def set_handoff(enabled: bool) -> None:
    """Allow (the default) or forbid handoffs; benchmarks compare the two. Takes effect for later launches and captures."""
    _ENABLED["on"] = enabled


def handoff_enabled() -> bool:
    """Whether launches may hand off (``set_handoff``)."""
    return _ENABLED["on"]


@dataclass(frozen=True, slots=True)
class Handoff:
    """The counters of one producer -> consumer pair: a chunk of ``cols`` output columns each, then one arrival count."""

    counters: torch.Tensor
    cols: int

    @staticmethod
    def between(device: torch.device, columns: int, cols: int) -> Handoff:
        """A handoff over ``columns`` producer output columns in chunks of ``cols``.

        NOTE(h7): every pair in a stream shares one zeroed buffer: a pair leaves it at zero, and the
        next pair's producer starts after this pair's consumer has finished. A buffer is never freed
        once made (a captured CUDA graph keeps its address).
        """
        need = columns // cols + 1
        buf = _BUFFERS.get(device)
        if buf is None or buf.numel() < need:
            buf = torch.zeros(max(need, 256), dtype=torch.int32, device=device)
            _BUFFERS[device] = buf
        return Handoff(buf, cols)


if triton is not None:

    @triton.jit
    def _load_acquire(ptr, ASM: tl.constexpr, SEM: tl.constexpr = 0):
        """``*ptr`` with acquire semantics at GPU scope: what the releasing program wrote before is visible after.

        An acquire load orders only the loads after it; an atomic or a fence would also wait for the
        weights this program already has in flight. The interpreter runs programs one at a time and
        has no PTX: a plain load there.
        """
        if ASM and (SEM & 2) == 0:
            return tl.inline_asm_elementwise(
                "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1
            )
        elif ASM:
            return tl.inline_asm_elementwise(
                "ld.relaxed.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1
            )
        else:
            return tl.load(ptr, volatile=True)

    @triton.jit
    def _handoff_signal(cnt_ptr, first_col, ncols, COLS: tl.constexpr, SEM: tl.constexpr = 0):
        """The producer: ``ncols`` columns from ``first_col`` are written (one chunk's), after every thread's stores."""
        tl.debug_barrier()
        if SEM & 1:
            tl.atomic_add(cnt_ptr + first_col // COLS, ncols, sem="relaxed", scope="gpu")
        else:
            tl.atomic_add(cnt_ptr + first_col // COLS, ncols, sem="release", scope="gpu")

    @triton.jit
    def _handoff_ready(
        cnt_ptr, k0, k_end, K2, rows, COLS: tl.constexpr, SPAN: tl.constexpr, ASM: tl.constexpr, SEM: tl.constexpr = 0
    ):
        """Packed bytes from ``k0`` up to which the int4 consumer's steps have their chunks (at most ``k_end``).

        Step ``k`` reads x's low columns ``k..`` and high ``K2 + k..``, each in one chunk (``COLS`` a
        multiple of the step, ``K2`` of ``COLS``), whole once all ``rows`` rows of x have their
        ``COLS`` columns. One poll reads the counters of the next ``SPAN`` chunks at once.
        """
        c = k0 // COLS + tl.arange(0, SPAN)
        last = (k_end - 1) // COLS
        cc = tl.minimum(c, last)  # the acquire loads take no mask: past the range, read the last chunk
        lo = _load_acquire(cnt_ptr + cc, ASM, SEM)
        hi = _load_acquire(cnt_ptr + K2 // COLS + cc, ASM, SEM)
        whole = ((lo >= COLS * rows) & (hi >= COLS * rows)) | (c > last)
        first_not = tl.min(tl.where(whole, SPAN, tl.arange(0, SPAN)), axis=0)
        return tl.minimum((k0 // COLS + first_not) * COLS, k_end)

    @triton.jit
    def _handoff_await(
        cnt_ptr, k0, k_end, K2, rows, COLS: tl.constexpr, SPAN: tl.constexpr, ASM: tl.constexpr, SEM: tl.constexpr = 0
    ):
        """The int4 consumer, before loading x of the step at byte ``k0``: wait until its chunks are whole.

        Returns ``_handoff_ready``'s bound, beyond ``k0``: the steps before it need no poll.
        """
        ready = _handoff_ready(cnt_ptr, k0, k_end, K2, rows, COLS, SPAN, ASM, SEM)
        while ready <= k0:
            _backoff(ASM)
            ready = _handoff_ready(cnt_ptr, k0, k_end, K2, rows, COLS, SPAN, ASM, SEM)
        return ready

    @triton.jit
    def _backoff(ASM: tl.constexpr):
        """A short sleep between polls, so that waiting programs do not flood L2 with loads."""
        if ASM:
            tl.inline_asm_elementwise(
                "nanosleep.u32 128; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
            )

    @triton.jit
    def _handoff_finish(cnt_ptr, chunks, PDL: tl.constexpr):
        """The consumer's end: the last program puts the counters back to zero; then the PDL wait.

        The wait returns once the producer has finished, so this kernel finishes after it and the
        launches after it keep their order.
        """
        tl.debug_barrier()
        total = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
        arrived = tl.atomic_add(cnt_ptr + chunks, 1, sem="acq_rel", scope="gpu")
        if arrived == total - 1:
            for c in range(chunks + 1):
                tl.store(cnt_ptr + c, 0)
        if PDL:
            tl.extra.cuda.gdc_wait()
