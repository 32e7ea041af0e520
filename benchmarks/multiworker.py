"""Multi-worker checkpoints: what a save costs each rank, against the anchors, in the same run.

Two gloo ranks on CPU (``torch.multiprocessing``), an MLP sharded with FSDP2 ``fully_shard`` and AdamW
(``--mb`` of weights; the optimizer's two moments make the state three times that). Each rank, per save:

* **blocked**: the time ``train_loop_per_worker`` waits for tunekit's save of its parts
  (``tunekit.multiworker``: the rank's DCP shard, its RNG and data position, its manifest with XXH3-128
  hashes) against a plain ``torch.distributed.checkpoint.save`` of the same state dict into the same disk;
* **background** (``WorkerSession(background=True)``, the default): blocked only while the rank copies
  its part (``async_save``'s staging on a gloo group of its own, the RNG and data position); the write,
  done here at once after the copy, is shown beside it;
* **peak memory** of the busiest rank during the save (its anonymous resident memory, ``RssAnon``,
  sampled every millisecond, above its level before the save) against the gather-to-rank-0 approach the Ray docs warn of: a full state dict
  gathered into rank 0's CPU memory (``full_state_dict=True, cpu_offload=True``) and ``torch.save``.

    python benchmarks/multiworker.py --mb 200 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def _anon() -> int:
    """This process's anonymous resident memory (``RssAnon``): what it allocated, not the file pages it maps
    (tunekit hashes a written shard through ``mmap``: page cache, which RSS would count)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    import psutil  # (only where /proc has no RssAnon: not a dependency of tunekit's; accelerate brings it)

    return psutil.Process().memory_info().rss


class _Peak:
    """The peak anonymous memory of this process above its level at entry, sampled every millisecond."""

    def __enter__(self) -> "_Peak":
        self.peak, self.done = 0, False
        self.base = _anon()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done:
            self.peak = max(self.peak, _anon() - self.base)
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        self.done = True
        self.thread.join()
        self.peak = max(self.peak, _anon() - self.base)


def _worker(rank: int, world: int, args: argparse.Namespace, root: str, port: int, out: "mp.Queue") -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict
    from torch.distributed.fsdp import fully_shard

    from tunekit import TrainingState
    from tunekit.multiworker._parts import shard_stager, stage_parts, write_parts
    from tunekit.trial.state import StateBuffers

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    width = int((args.mb * 1e6 / 4 / 2) ** 0.5)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, width)).sum().backward()
    opt.step()
    state = TrainingState(models={"model": model}, optimizers={"opt": opt})
    group, buffers, stager = dist.new_group(backend="gloo"), StateBuffers(), shard_stager()  # as WorkerSession does
    rows = []
    for i in range(-1, args.repeat):  # run -1 warms up (first-call costs), not shown
        for how in HOWS:
            where = os.path.join(root, f"{how}-{i}")
            dist.barrier()
            with _Peak() as peak:
                start = time.perf_counter()
                if how == "plain":
                    msd, osd = get_state_dict(model, opt)
                    dcp.save({"models": {"model": msd}, "optimizers": {"opt": osd}},
                             storage_writer=dcp.FileSystemWriter(os.path.join(where, f"rank-{rank}")))
                elif how == "tunekit":
                    write_parts(state, where, rank=rank, world_size=world, sharded=True, metadata={"iteration": i})
                elif how == "background":  # blocked: the copy; the write (here at once) runs on another thread
                    write = stage_parts(state, where, rank=rank, world_size=world, sharded=True,
                                        metadata={"iteration": i}, buffers=buffers, process_group=group,
                                        stager=(stager := shard_stager(stager)))
                    staged = time.perf_counter() - start
                    write()
                else:
                    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
                    full = get_model_state_dict(model, options=options)
                    _, full_opt = get_state_dict(model, opt, options=options)
                    if rank == 0:
                        os.makedirs(where, exist_ok=True)
                        torch.save({"model": full, "opt": full_opt}, os.path.join(where, "state.pt"))
                    del full, full_opt
                blocked = time.perf_counter() - start
                if how == "background":
                    staged, blocked = blocked, staged  # (blocked: the copy; the whole save in the other column)
            rows.append((i, how, rank, blocked, peak.peak))
            if how == "background":
                rows.append((i, "background-write", rank, staged, peak.peak))
    out.put(rows)
    dist.barrier()
    dist.destroy_process_group()


HOWS = ("plain", "tunekit", "background", "gather")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=200.0, help="MB of weights (the state is 3x with AdamW)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="tunekit-mw-bench-") as root:
        port = 29000 + os.getpid() % 1000
        procs = [ctx.Process(target=_worker, args=(r, 2, args, root, port, out)) for r in range(2)]
        for p in procs:
            p.start()
        rows = [row for _ in procs for row in out.get()]
        for p in procs:
            p.join()
    print(f"multi-worker save, 2 gloo ranks, FSDP2, {args.mb:.0f} MB of weights + AdamW "
          f"({3 * args.mb:.0f} MB of state, half per rank), {args.repeat} runs")
    print("run  each rank blocked per save (busiest rank): tunekit / plain dcp.save; background (its whole write)"
          "   peak memory busiest rank: tunekit, background / gather-to-rank-0")
    hows = (*HOWS, "background-write")
    for i in range(args.repeat):
        got = {(how, rank): (b, m) for j, how, rank, b, m in rows if j == i}
        slow = {how: max(got[(how, r)][0] for r in (0, 1)) for how in hows}
        peak = {how: max(got[(how, r)][1] for r in (0, 1)) for how in hows}
        print(f"{i:>3}  {slow['tunekit']:.3f} s / {slow['plain']:.3f} s = {slow['tunekit'] / slow['plain']:.2f}x; "
              f"background {slow['background']:.3f} s = {slow['background'] / slow['plain']:.2f}x "
              f"({slow['background-write']:.3f} s)"
              f"   {peak['tunekit'] / 1e6:5.0f} MB, {peak['background'] / 1e6:5.0f} MB / {peak['gather'] / 1e6:5.0f} MB"
              f" = {peak['tunekit'] / max(peak['gather'], 1):.2f}x, {peak['background'] / max(peak['gather'], 1):.2f}x"
              f"  (plain dcp.save {peak['plain'] / 1e6:.0f} MB; gather blocked {slow['gather']:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
