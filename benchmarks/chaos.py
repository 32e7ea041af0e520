"""Nothing lost under real failures: real Tune runs whose workers are SIGKILLed inside checkpoint
writes, then one invariant check of what each run left.

Each run trains a wide MLP (``--mb`` of weights; checkpoints twice that with the momentum buffers), a
checkpoint every iteration, ``num_to_keep=1``, ``max_failures=20``, 4 trials on 2 CPUs (1 for the
``one`` scenario). A failure injector in the driver (``tunekit.testing``) watches the trial
directories and SIGKILLs the worker writing a checkpoint (a two-phase save names its writer in its
staging directory), for a fraction of the writes it sees, up to ``--kills`` a run. After the run:
0 trials in ERROR, every trial's newest checkpoint exists and verifies, no interrupted write left,
every iteration once in ``load_results``, ``tunekit verify`` and ``tunekit status`` exit 0; for the
``one`` scenario the final weights equal an uninterrupted run's bit for bit.

Scenarios: ``one`` (one trial, no scheduler), ``pbt`` (``pbt_setup``, actor reuse, plus
``KeepCheckpoints(trial_latest=1)``), ``pbt_function`` (the same with a function trainable),
``noreuse`` (``pbt_setup`` with ``reuse_actors=False``), ``ray_pbt`` (Ray's own
``PopulationBasedTraining`` with actor reuse), ``s3`` (``pbt`` on an S3 server, moto's, on 127.0.0.1: a save
is written and uploaded before it returns, so there is no write in flight to aim at; its workers are
killed at random, at exponential intervals of mean ``--mean-s``), ``driver`` (``pbt`` in a driver process
of its own, with its own Ray, whose workers are killed inside writes as in ``pbt`` and which SIGKILLs itself
after a seeded number of results; then ``tunekit resume`` continues it here, its workers again killed
inside writes, and the invariants are checked on what the two drivers left), ``sigint`` and ``sigterm`` (the
same, the driver ended by Ctrl-C or SIGTERM at a seeded result: Tune stops gracefully, then ``tunekit
resume``), ``two_resumes`` (a killed driver, then two ``tunekit resume`` processes at once: one runs the
experiment to its end, the other refuses in one line naming it), ``node_loss_s3`` (``pbt`` on a 3-node
``ray start`` cluster with moto's S3 storage, whole worker nodes SIGKILLed and replaced, the driver SIGKILLed,
then ``tunekit resume --address``: ``benchmarks/node_loss.py``). Every trial must end at its stop by its last
row, Ray's iteration, the read model's and its newest checkpoint's own.

    python benchmarks/chaos.py --runs 5                     # the whole matrix
    python benchmarks/chaos.py --scenarios pbt --runs 2     # one scenario
    python benchmarks/chaos.py --scenarios driver --runs 5  # driver kills, then tunekit resume
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from ray import tune  # noqa: E402

from tunekit import FunctionSession, TorchTrainable, TrainingState, function_trainable  # noqa: E402

SCENARIOS = ("one", "pbt", "pbt_function", "noreuse", "ray_pbt", "s3", "driver", "sigint", "sigterm", "two_resumes",
             "node_loss_s3")
#: The scenarios whose driver is a child process ended by a signal, then resumed here: the signal it sends itself.
ENDINGS = {"driver": signal.SIGKILL, "sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "two_resumes": signal.SIGKILL}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INJECTOR: Any = None  # the killed driver's injector (the ``driver`` scenario's child)


def _build(config: dict[str, Any], device: Any = "cpu") -> TrainingState:
    torch.manual_seed(config["seed"])
    width = config["width"]
    model = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    return TrainingState(models={"model": model}, optimizers={"optimizer": optimizer})


def _step(state: TrainingState, config: dict[str, Any]) -> dict[str, float]:
    generator = torch.Generator().manual_seed(config["seed"] * 1000 + state.counters.iteration)
    x = torch.randn(32, 256, generator=generator)
    loss = torch.nn.functional.mse_loss(state.models["model"](x), x.flip(1))
    state.optimizers["optimizer"].zero_grad()
    loss.backward()
    state.optimizers["optimizer"].step()
    return {"loss": loss.item()}


class Wide(TorchTrainable):
    """A wide MLP: ``width`` hidden units, about ``2 * 256 * width`` weights."""

    def build(self, config: dict[str, Any]) -> TrainingState:
        return _build(config)

    def train_iteration(self) -> dict[str, float]:
        return _step(self.state, self.config)


def train_wide(config: dict[str, Any]) -> None:
    state = _build(config)
    session = FunctionSession(state, config=config)
    while True:
        session.report(_step(state, config))


WideFunction = function_trainable(train_wide, name="WideFunction")


def _run(scenario: str, storage: str, name: str, *, width: int, iterations: int, injector: Any,
         extra: tuple[Any, ...] = ()) -> tuple[Any, str]:
    from ray.tune.schedulers import PopulationBasedTraining

    from tunekit.callbacks import KeepCheckpoints, ParquetLogger
    from tunekit.schedule.pbt import pbt_setup

    trials = 1 if scenario == "one" else 4
    trainable = WideFunction if scenario == "pbt_function" else Wide
    param_space = {"width": width, "seed": tune.grid_search(list(range(trials))), "lr": 0.01}
    callbacks: list[Any] = [ParquetLogger(), *extra]
    checkpoint = tune.CheckpointConfig(checkpoint_frequency=1, num_to_keep=1, checkpoint_at_end=True)
    tune_config: dict[str, Any] = {}
    if scenario in ("pbt", "pbt_function", "noreuse", "s3"):
        setup = pbt_setup(trainable, metric="loss", mode="min", perturbation_interval=2,
                          mutations={"lr": [0.005, 0.01, 0.02]}, num_to_keep=1)
        tune_config = setup.tune_config_kwargs()
        checkpoint = dataclasses.replace(setup.checkpoint_config, checkpoint_frequency=1)
        if scenario == "noreuse":
            tune_config["reuse_actors"] = False
        else:
            callbacks.append(KeepCheckpoints(trial_latest=1))
    elif scenario == "ray_pbt":
        tune_config = {"metric": "loss", "mode": "min", "reuse_actors": True,
                       "scheduler": PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=2,
                                                            hyperparam_mutations={"lr": [0.005, 0.01, 0.02]})}
    with injector:
        grid = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(**tune_config),
            run_config=tune.RunConfig(name=name, storage_path=storage, stop={"training_iteration": iterations},
                                      checkpoint_config=checkpoint, callbacks=callbacks,
                                      failure_config=tune.FailureConfig(max_failures=20), verbose=0),
        ).fit()
    return grid, experiment_uri(storage, name)


def experiment_uri(storage: str, name: str) -> str:
    """The URI of experiment ``name`` under ``storage`` (a path, or a URI whose query stays at its end)."""
    base, sep, query = storage.partition("?")
    return f"{base.rstrip('/')}/{name}{sep}{query}"


class _DieAfter(tune.Callback):
    """A Tune callback that sends its own driver ``sig`` (SIGKILL, or SIGINT/SIGTERM: Ctrl-C, a scheduler's
    stop) at the ``n``-th result, once, and only in the process it was made in (Tune saves callbacks with the
    experiment, and the resumed driver must not stop). It first prints the kills ``INJECTOR`` (the driver's
    injector) made."""

    def __init__(self, n: int, sig: int = signal.SIGKILL) -> None:
        self.n, self.sig, self.pid, self.seen = n, sig, os.getpid(), 0

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.seen += 1
        if self.seen == self.n and os.getpid() == self.pid:
            kills = INJECTOR.kills if INJECTOR is not None else []
            print(f"CHAOS-KILLS {len(kills)} {sum(k.inside_write for k in kills)} "
                  + ",".join(k.phase.replace(" ", "_") for k in kills), flush=True)
            os.kill(os.getpid(), self.sig)


def _child(argv: list[str]) -> None:
    """The ended driver of the ``driver``/``sigint``/``sigterm``/``two_resumes`` scenarios: ``--child STORAGE
    NAME DIE_AFTER SEED WIDTH ITERATIONS WRITES KILLS AIM SIGNAL``."""
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))  # workers
    import ray

    import benchmarks.chaos as imported  # the trainable is pickled as benchmarks.chaos.Wide, not __main__'s
    from tunekit.testing import Injector

    storage, name, die_after, seed, width, iterations, writes, kills, aim, sig = argv
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    imported.INJECTOR = Injector(storage, writes=float(writes), max_kills=int(kills), seed=int(seed),
                                 trainable="Wide", aim=None if aim == "anywhere" else aim)
    stopper = imported._DieAfter(int(die_after), int(sig))
    imported._run("pbt", storage, name, width=int(width), iterations=int(iterations), injector=imported.INJECTOR,
                  extra=(stopper,))
    print("CHAOS-STOPPED" if stopper.seen >= stopper.n else "CHAOS-KILLS the driver was not stopped: it finished",
          flush=True)


def _child_cluster(argv: list[str]) -> None:
    """The driver of a ``node_loss_s3`` run, on the cluster at ADDRESS: ``--child-cluster ADDRESS STORAGE NAME
    DIE_AFTER WIDTH ITERATIONS``; it SIGKILLs itself at the DIE_AFTER-th result."""
    import ray

    import benchmarks.chaos as imported

    address, storage, name, die_after, width, iterations = argv
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    imported._run("pbt", storage, name, width=int(width), iterations=int(iterations), injector=_Nothing(),
                  extra=(imported._DieAfter(int(die_after)),))


def _driver_run(local: str, name: str, run: int, args: Any, width: int,
                scenario: str = "driver") -> tuple[Any, str, list, str]:
    """A run of a scenario that ends its driver (:data:`ENDINGS`): SIGKILL, Ctrl-C or SIGTERM of a driver of
    its own, then ``tunekit resume`` here (``two_resumes``: two at once, in processes of their own; one must
    refuse, naming the other). Returns the grid, the experiment, the kills (driver's and resume's) and a line
    about the driver."""
    from benchmarks.chaos import Wide as Imported
    from tunekit.testing import Injector, Kill
    from tunekit.testing import run_and_reap
    from tunekit.commands.resume import resume_experiment
    from tunekit.experiment.snapshot import format_counts

    die_after = random.Random(run).randint(6, 4 * args.iterations - 8)
    env = {**os.environ, "PYTHONPATH": ROOT, "RAY_AUTH_MODE": "disabled"}
    done = run_and_reap([sys.executable, os.path.abspath(__file__), "--child", local, name, str(die_after), str(run),
                         str(width), str(args.iterations), str(args.writes), str(args.kills // 2 or 1), args.aim,
                         str(int(ENDINGS[scenario]))],
                        env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    said = [line for line in done.stdout.splitlines() if line.startswith("CHAOS-KILLS")]
    ended = done.returncode == -signal.SIGKILL if ENDINGS[scenario] == signal.SIGKILL else (
        done.returncode == 0 and "CHAOS-STOPPED" in done.stdout)
    if not ended or not said or "not stopped" in said[-1]:
        raise SystemExit(f"{scenario} run {run}: the driver did not end as {ENDINGS[scenario].name} ends it "
                         f"(exit {done.returncode}):\n" + (done.stdout + done.stderr)[-3000:])
    _, count, _, phases = (said[-1].split(" ") + [""])[:4]
    kills = [Kill(0.0, 0, phase.replace("_", " ")) for phase in phases.split(",") if phase][: int(count)]
    experiment = os.path.join(local, name)
    if scenario == "two_resumes":
        return (*_two_resumes(experiment, env, run, Imported), kills,
                f"driver killed at result {die_after} after {len(kills)} kills, two resumes at once")
    injector = Injector(local, writes=args.writes, max_kills=args.kills - len(kills), seed=run + 1000,
                        trainable="Wide", aim=None if args.aim == "anywhere" else args.aim)
    with injector:
        summary = resume_experiment(experiment, trainable="benchmarks.chaos:Wide", stream=io.StringIO())
    grid = tune.Tuner.restore(experiment, trainable=Imported).get_results()
    return (grid, experiment, kills + injector.kills,
            f"driver {ENDINGS[scenario].name} at result {die_after} after {len(kills)} kills, resumed: "
            f"{format_counts(summary.before)} -> {format_counts(summary.after.counts())}")


def _two_resumes(experiment: str, env: dict[str, str], run: int, trainable: Any) -> tuple[Any, str]:
    """Two ``tunekit resume`` processes started at once: one runs the experiment to its end, the other refuses in
    one line naming it (the experiment's lease); anything else ends the benchmark."""
    import subprocess

    command = [sys.executable, "-m", "tunekit.cli", "resume", experiment, "--trainable", "benchmarks.chaos:Wide",
               "--cpus", "2"]
    procs = [subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=1800) for p in procs]
    codes = sorted(p.returncode for p in procs)
    refused = [err for (_, err), p in zip(outs, procs) if p.returncode == 2]
    if codes != [0, 2] or len(refused) != 1 or "is in use" not in refused[0] or len(refused[0].strip().splitlines()) != 1:
        raise SystemExit(f"two_resumes run {run}: expected one resume to run and one to refuse; exits {codes}:\n"
                         + "\n".join(o + e for o, e in outs)[-3000:])
    return tune.Tuner.restore(experiment, trainable=trainable).get_results(), experiment


class _Nothing:
    kills: list = []

    def __enter__(self) -> _Nothing:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _s3_server() -> Any:
    """moto's S3 server on 127.0.0.1 (fake credentials), and a function: run name -> a fresh bucket's URI."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    os.environ.update(AWS_ACCESS_KEY_ID="chaos", AWS_SECRET_ACCESS_KEY="chaos", AWS_EC2_METADATA_DISABLED="true")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

    def bucket(name: str) -> str:
        client.create_bucket(Bucket=name)
        return f"s3://{name}/runs?endpoint_override={endpoint}&region=us-east-1"

    return bucket, client


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        _child(argv[1:])
        return 0
    if argv[:1] == ["--child-cluster"]:
        _child_cluster(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--from-run", type=int, default=0, help="the first run's number (its seed): go on after run N-1")
    parser.add_argument("--kills", type=int, default=6, help="kills a run at most")
    parser.add_argument("--writes", type=float, default=0.35, help="fraction of the writes seen whose writer is killed")
    parser.add_argument("--mb", type=float, default=55.0, help="MB of weights (checkpoints are twice that)")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--keep", metavar="DIR", help="copy the experiment of a run with violations here")
    parser.add_argument("--mean-s", type=float, default=4.0, help="s3: mean seconds between random worker kills")
    parser.add_argument("--aim", choices=("anywhere", "manifest"), default="anywhere",
                        help="where inside a write to kill (manifest: state.pt whole, its manifest being hashed)")
    args = parser.parse_args(argv)
    import ray

    from tunekit.testing import Injector, Kill, invariant_violations
    from tunekit import read_state

    width = max(8, int(args.mb * 1e6 / 4 / (2 * 256)))
    chosen = args.scenarios.split(",")
    s3 = _s3_server() if {"s3", "node_loss_s3"} & set(chosen) else None  # before Ray: workers inherit credentials
    if set(chosen) - {"node_loss_s3"}:  # node_loss_s3 runs on a cluster of its own
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    print(f"chaos: {args.mb:.0f} MB of weights (width {width}), {args.iterations} iterations, a checkpoint each, "
          f"num_to_keep=1, max_failures=20; up to {args.kills} kills a run, {args.writes:.0%} of writes", flush=True)
    reference: dict[Any, Any] = {}
    totals = {}
    for scenario in args.scenarios.split(","):
        if scenario not in SCENARIOS:
            parser.error(f"--scenarios: unknown {scenario!r}; expected some of {', '.join(SCENARIOS)}")
        if scenario == "one" and not reference:
            with tempfile.TemporaryDirectory() as storage:
                grid, _ = _run("one", storage, "reference", width=width, iterations=args.iterations,
                               injector=_Nothing())
                reference = {0: read_state(grid[0].checkpoint)}
        ok_runs, inside, phases, violations_all = 0, 0, {}, []
        for run in range(args.from_run, args.runs):
            with tempfile.TemporaryDirectory() as local:
                storage = s3[0](f"{scenario}-{run}") if scenario == "s3" else local
                start = time.monotonic()
                note = ""
                if scenario == "node_loss_s3":
                    from benchmarks.node_loss import node_loss_run

                    grid, experiment, lost, note = node_loss_run(run, args, width, *s3)
                    kills = [Kill(0.0, 0, f"write: node lost {p}" if p == "during an upload" else f"node lost {p}")
                             for p in lost]
                elif scenario in ENDINGS:
                    grid, experiment, kills, note = _driver_run(local, f"{scenario}-{run}", run, args, width,
                                                                scenario)
                else:
                    injector = Injector(local, writes=args.writes, max_kills=args.kills, seed=run, trainable="Wide",
                                        mean_interval_s=args.mean_s if scenario == "s3" else None,
                                        aim=None if args.aim == "anywhere" else args.aim)
                    grid, experiment = _run(scenario, storage, f"{scenario}-{run}", width=width,
                                            iterations=args.iterations, injector=injector)
                    kills = injector.kills
                seconds = time.monotonic() - start
                violations = invariant_violations(experiment, grid, reference=reference if scenario == "one" else None,
                                                  stop=args.iterations)
                if scenario == "node_loss_s3" and (len(kills) < 3 or not any(k.inside_write for k in kills)):
                    violations.append(f"only {len(kills)} node kills, "
                                      f"{sum(k.inside_write for k in kills)} during an upload (3 and 1 wanted)")
                if violations and args.keep and "://" not in experiment:
                    kept = os.path.join(args.keep, f"{scenario}-{run}")
                    shutil.copytree(experiment, kept, symlinks=True, dirs_exist_ok=True)
                    print(f"  (the experiment of {scenario} run {run} is kept in {kept})", flush=True)
            landed = sum(k.inside_write for k in kills)
            inside += landed
            for kill in kills:
                phases[kill.phase] = phases.get(kill.phase, 0) + 1
            ok_runs += not violations
            violations_all += violations
            print(f"  {scenario} run {run}: {len(kills)} kills, {landed} inside a write, {note + ', ' if note else ''}"
                  f"{seconds:.0f} s: "
                  + ("all invariants hold" if not violations else "VIOLATED: " + " | ".join(violations)), flush=True)
        totals[scenario] = (ok_runs, inside, phases, violations_all)
        print(f"{scenario}: {ok_runs}/{args.runs - args.from_run} runs nothing lost; {inside} kills inside writes "
              f"({', '.join(f'{p} {n}' for p, n in sorted(phases.items()))})", flush=True)
    print("\nscenario       runs ok   kills inside writes   violations")
    for scenario, (ok_runs, inside, _, violations) in totals.items():
        print(f"{scenario:<14} {ok_runs}/{args.runs - args.from_run:<6}  {inside:>19}   {len(violations)}")
    return 0 if all(not v for *_, v in totals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
