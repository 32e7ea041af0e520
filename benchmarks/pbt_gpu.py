"""Benchmark: one PBT pause/resume cycle of a large-model trial on a GPU, against its bytes and the disk.

Runs a tunekit ``TorchTrainable`` holding an MLP of ``--params`` parameters
(default 100M) plus its Adam state in one Ray worker with a GPU (or in this
process with ``--device cpu``), and times what Tune does to it when PBT pauses
it and later resumes it in a reused worker that ran another trial meanwhile:

* ``save`` (the pause checkpoint), ``reset`` (the worker is given to another
  trial: the state is dropped and rebuilt), ``restore`` and the first step after;
* device memory free before the pause, after the reset released the trial's
  memory, and after the resume (``torch.cuda.mem_get_info``);
* against the floor for those bytes: the checkpoint's size divided by the
  disk's write bandwidth (with fsync) and the read-back of the checkpoint file, in the same run,
  and ``torch.save``/``torch.load`` of the same state.

Usage::

    python benchmarks/pbt_gpu.py                     # on a machine with a CUDA GPU
    python benchmarks/pbt_gpu.py --device cpu --params 20000000   # the same path on the CPU
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import torch
from torch import nn

from tunekit import TorchTrainable, TrainingState, read_state
from tunekit.checkpoint._trial_dir import await_write
from tunekit.trial.device import release_memory

WIDTH = 4096


class BigMLP(TorchTrainable):
    """An MLP of about ``config["params"]`` parameters, trained with Adam on random data."""

    def build(self, config: dict[str, Any]) -> TrainingState:
        layers = max(1, int(config["params"]) // (WIDTH * WIDTH))
        model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(layers)]).to(self.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.get("lr", 1e-4))
        return TrainingState(models={"model": model}, optimizers={"optimizer": optimizer})

    def train_iteration(self) -> dict[str, Any]:
        x = torch.randn(64, WIDTH, device=self.device)
        loss = self.state.model(x).square().mean()
        self.state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.state.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return {"loss": loss.item()}


def _free_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free / 2**30


def _disk_bandwidth(folder: str, nbytes: int, written: str) -> tuple[float, float]:
    """GB/s: a write of ``nbytes`` with fsync (``run.py``'s measurement), and reading ``written`` back."""
    from run import _disk_write_bandwidth  # benchmarks/ is on sys.path when run as a script

    write = _disk_write_bandwidth(folder, nbytes) / 1e9
    t0 = time.perf_counter()
    with open(written, "rb") as fh:
        while fh.read(64 << 20):
            pass
    return write, os.path.getsize(written) / (time.perf_counter() - t0) / 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _to(tree: Any, device: torch.device) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {key: _to(value, device) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to(value, device) for value in tree)
    return tree


def cycle(params: int, folder: str) -> dict[str, Any]:
    """One pause/resume cycle inside the current process (a Ray worker or this one)."""
    from tunekit._ray import storage_context

    out: dict[str, Any] = {}
    config = {"params": params, "seed": 0, "lr": 1e-4}
    storage = storage_context(folder, "exp", "trial")
    trainable = BigMLP(config=config, storage=storage)
    device = trainable.device
    out["device"] = str(device)
    out["param_count"] = sum(p.numel() for p in trainable.state.model.parameters())
    trainable.train()  # Adam state exists from here on
    out["free_before_pause_gib"] = _free_gib(device)
    raw = os.path.join(folder, "raw.pt")
    t0 = time.perf_counter()
    torch.save(trainable.state.state_dict(), raw)  # the anchor: the same state, plain torch.save
    out["torch_save_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    saved = trainable.save()
    out["save_s"] = time.perf_counter() - t0  # what the pause blocks the trial for
    await_write(saved.checkpoint.path)  # the write goes on in the background (two-phase save)
    out["save_durable_s"] = time.perf_counter() - t0
    state_file = os.path.join(saved.checkpoint.path, "state.pt")
    out["checkpoint_bytes"] = os.path.getsize(state_file)
    t0 = time.perf_counter()
    trainable.reset({**config, "seed": 1}, storage)  # another trial takes the worker: drop and rebuild
    out["reset_s"] = time.perf_counter() - t0
    trainable.cleanup()  # the worker lets the trial go (what a stop does)
    out["free_after_release_gib"] = _free_gib(device)
    out["release_needed_gc"] = release_memory()  # True: cleanup's release left tensors behind
    trainable.reset(config, storage)
    t0 = time.perf_counter()
    trainable.state  # the rebuild the reset deferred to the state's first use (a plain trainable's reset does it)
    _sync(device)
    out["rebuild_s"] = time.perf_counter() - t0
    # The anchor where the restore runs (after the release and the rebuild), then the restore, then both again
    # (warm): a restore measured first against an anchor measured last, everything warm, told nothing.
    for run in ("", "_again"):
        _sync(device)
        t0 = time.perf_counter()
        loaded = torch.load(raw, weights_only=True, map_location=device)
        _sync(device)
        out["torch_load_s" + run] = time.perf_counter() - t0
        del loaded
        t0 = time.perf_counter()
        trainable.restore(saved)
        _sync(device)
        out["restore_s" + run] = time.perf_counter() - t0
    t0 = time.perf_counter()
    read_state(saved.checkpoint.path)
    out["read_state_cpu_s"] = time.perf_counter() - t0  # its part: the file into CPU memory, verified
    t0 = time.perf_counter()
    on_cpu = torch.load(raw, weights_only=True, map_location="cpu")
    out["torch_load_cpu_s"] = time.perf_counter() - t0  # the anchor's part: the file into CPU memory
    t0 = time.perf_counter()
    _to(on_cpu, device)
    _sync(device)
    out["to_device_s"] = time.perf_counter() - t0  # the other part: CPU memory (pageable) to the device
    del on_cpu
    t0 = time.perf_counter()
    trainable.train()
    out["first_step_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    trainable.train()
    out["step_s"] = time.perf_counter() - t0
    out["free_after_resume_gib"] = _free_gib(device)
    trainable.stop()
    out["state_file"] = state_file
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=100_000_000)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="tunekit-pbt-gpu-")
    try:
        if args.device == "cuda":
            if not torch.cuda.is_available():
                raise SystemExit("pbt_gpu.py: no CUDA GPU here; pass --device cpu to run the same path on the CPU")
            import ray

            ray.init(address="local", num_gpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
            result = ray.get(ray.remote(num_gpus=1)(cycle).remote(args.params, folder))
            ray.shutdown()
        else:
            import ray

            ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
            result = cycle(args.params, folder)  # in this process
            ray.shutdown()
        # In this process (benchmarks/ is importable here), on the same disk as the checkpoint.
        result["disk_write_gbs"], result["disk_read_gbs"] = _disk_bandwidth(
            folder, result["checkpoint_bytes"], result["state_file"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    gb = result["checkpoint_bytes"] / 1e9
    print(f"device {result['device']}, {result['param_count'] / 1e6:.0f}M parameters, checkpoint {gb:.2f} GB")
    for key in ("save_s", "save_durable_s", "torch_save_s", "reset_s", "rebuild_s", "torch_load_s", "restore_s",
                "torch_load_s_again", "restore_s_again", "read_state_cpu_s", "torch_load_cpu_s", "to_device_s", "first_step_s", "step_s"):
        print(f"  {key:18s} {result[key] * 1e3:9.1f} ms")
    print(f"  restore / torch.load where it runs: {result['restore_s'] / result['torch_load_s']:.2f}x, "
          f"again (warm): {result['restore_s_again'] / result['torch_load_s_again']:.2f}x")
    print(f"  disk: write+fsync {result['disk_write_gbs']:.2f} GB/s, read {result['disk_read_gbs']:.2f} GB/s")
    floor = gb / result["disk_write_gbs"] + gb / result["disk_read_gbs"]
    latency = result["save_s"] + result["reset_s"] + result["rebuild_s"] + result["restore_s"]
    print(f"  pause-to-resume (save + reset + rebuild + restore) {latency:.2f} s; bytes / disk bandwidth {floor:.2f} s "
          f"-> {latency / floor:.2f}x")
    if result["free_before_pause_gib"] is not None:
        print(f"  free device memory: before pause {result['free_before_pause_gib']:.2f} GiB, after release "
              f"{result['free_after_release_gib']:.2f} GiB (gc.collect needed: {result['release_needed_gc']}), "
              f"after resume {result['free_after_resume_gib']:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
