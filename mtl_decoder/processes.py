"""Several processes of one job: who this process is, which records it takes, and gathering what they computed.

A launcher (``torchrun``, ``accelerate launch``) starts the processes and sets WORLD_SIZE / RANK; ``Processes.join``
then forms the group through Accelerate (NCCL between GPUs, gloo on CPUs), with each process on its own device.

**Which records a process takes** (``Share``): the records are dealt in blocks of ``block`` consecutive records,
block b to process b mod N. The block is the Predictor's buffer (16 batches), the unit it sorts by length and
batches: a process given whole blocks forms exactly the batches one process would form, so its predictions are
the same to the last bit. Dealing single records (record i to process i mod N) would change every batch's
neighbours and padding, and with them the last bits of the probabilities (measured on the SST-2 sample: 30 of
200 output lines differed, by ~1e-8); blocks keep the output byte-identical whatever the number of processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from mtl_decoder.errors import UserError

if TYPE_CHECKING:  # the CLI imports this module: torch only when a group is formed
    import torch

T = TypeVar("T")


def launched() -> bool:
    """Whether this process is one of several started by a launcher (WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def is_main_process() -> bool:
    """Whether this process reports for the run: the launcher's rank 0, or a process on its own."""
    return int(os.environ.get("RANK", "0")) == 0


def deal(items: Sequence[T], size: Callable[[T], int], rank: int, world: int) -> list[T]:
    """Process ``rank``'s share of one-time work that fills a shared cache: every world-th item, longest first.

    The same order on every process (ties by position), so the shares do not overlap, cover every item and cost
    about the same. A frozen trunk's state precompute and a teacher's labelling both deal their work this way."""
    order = sorted(range(len(items)), key=lambda i: (-size(items[i]), i))
    return [items[i] for i in order[rank::world]]


class ProcessFailed(UserError):
    """Another process of the run failed (its error is in the message) or could no longer be reached."""


@dataclass(frozen=True)
class Share:
    """The records one process takes.

    Blocks of ``block`` records; shard ``shard`` of ``shards`` takes the blocks
    b with b mod shards == shard, and within a shard, process ``rank`` of ``world`` takes every world-th of them."""

    block: int
    """Records per block (the Predictor's buffer: batch size x buffer batches)."""
    shard: int = 0
    """This shard (``predict --shard K/N``: K); 0 without --shard."""
    shards: int = 1
    """Shards of the job (N); 1 without --shard."""
    rank: int = 0
    """This process within its shard (the launcher's rank)."""
    world: int = 1
    """Processes of the shard (the launcher's world size)."""

    def __post_init__(self) -> None:
        if self.block < 1:
            raise UserError(f"block must be at least 1, got {self.block}")
        if not 0 <= self.shard < self.shards:
            raise UserError(f"shard must be K/N with 0 <= K < N, got {self.shard}/{self.shards}")
        if not 0 <= self.rank < self.world:
            raise UserError(f"rank {self.rank} is outside a world of {self.world}")

    def block_of(self, position: int) -> int:
        return position // self.block

    def in_shard(self, position: int) -> bool:
        """Whether record ``position`` (counted over the records dealt) belongs to this shard."""
        return self.block_of(position) % self.shards == self.shard

    def owns(self, position: int) -> bool:
        """Whether record ``position`` is this process's to predict."""
        b = self.block_of(position)
        return b % self.shards == self.shard and (b // self.shards) % self.world == self.rank

    def rounds(self, positions: int) -> int:
        """Rounds of gathering over ``positions`` records: in each, every process of the shard hands in one block."""
        shard_blocks = len(range(self.shard, -(-positions // self.block), self.shards))
        return -(-shard_blocks // self.world)

    def take(self, items: Sequence[T]) -> list[T]:
        """The items this process owns, in order."""
        return [item for i, item in enumerate(items) if self.owns(i)]

    def restore(self, parts: Sequence[Sequence[T]], total: int) -> list[T]:
        """Every process's ``take`` (in rank order; one shard) back in the order of the ``total`` items."""
        cursors = [iter(part) for part in parts]
        return [next(cursors[(self.block_of(i) // self.shards) % self.world]) for i in range(total)]


@dataclass
class Processes:
    """This process in its group: rank, world size and device (None: one process, the caller's device)."""

    rank: int = 0
    world: int = 1
    device: torch.device | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def join(cls) -> Processes:
        """The launcher's group (formed on first use through Accelerate), or this process alone."""
        if not launched():
            return cls()
        from accelerate import PartialState

        from mtl_decoder.runtime import default_device

        # Accelerate forms a gloo group for CPU processes only when told it runs on CPU (see training.trainer).
        state = PartialState(cpu=default_device().type == "cpu")
        return cls(state.process_index, state.num_processes, state.device)

    def gather(self, obj: Any) -> list[Any] | None:
        """Every process's ``obj`` on the main process, in rank order (None on the others)."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world if self.is_main else None
        self._collective(lambda dist: dist.gather_object(obj, out, dst=0))
        return out

    def all_gather(self, obj: Any) -> list[Any]:
        """Every process's ``obj`` on every process, in rank order."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        self._collective(lambda dist: dist.all_gather_object(out, obj))
        return out

    def broadcast(self, obj: Any) -> Any:
        """The main process's ``obj`` on every process."""
        if self.world == 1:
            return obj
        box = [obj]
        self._collective(lambda dist: dist.broadcast_object_list(box, src=0))
        return box[0]

    def distribute(self, block: int) -> Callable[[list[T], Callable[[list[T]], list[Any]]], list[Any]]:
        """The scoring loop's ``distribute`` hook.

        The scoring loop's ``distribute`` hook (mtl_decoder.evaluation.scoring): each process runs its blocks of
        the examples, and every process gets all the results back in the examples' order."""
        share = Share(block, rank=self.rank, world=self.world)

        def distribute(items: list[T], run: Callable[[list[T]], list[Any]]) -> list[Any]:
            return share.restore(self.all_gather(run(share.take(items))), len(items))

        return distribute

    def barrier(self) -> None:
        if self.world > 1:
            self._collective(lambda dist: dist.barrier())

    def _collective(self, call: Callable[[Any], Any]) -> None:
        """Run a collective; a process that died (killed, crashed) surfaces here as a lost connection."""
        import torch.distributed as dist

        try:
            call(dist)
        except RuntimeError as err:
            raise ProcessFailed(
                f"rank {self.rank} of {self.world}: lost contact with another process of the run (killed or "
                f"failed; the launcher's summary names it); nothing was written ({str(err).splitlines()[0][:200]})"
            ) from err
