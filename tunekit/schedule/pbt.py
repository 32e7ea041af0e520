"""A consistent Population Based Training setup for tunekit trainables.

:func:`pbt_setup` builds the three pieces that must agree with each other:

* ``PopulationBasedTraining`` over hyperparameters the trainable can change in
  place (a PBT exploit applies the mutated values to the restored optimizer);
* ``TuneConfig`` keyword arguments with ``reuse_actors=True`` (an exploit then
  resets and restores an actor instead of starting a new process);
* a ``CheckpointConfig`` whose frequency is the perturbation interval, so the
  checkpoint an exploit clones is the donor's state at the perturbation, never
  a stale one (tunekit trainables write one checkpoint per iteration however
  often they are asked). The scheduler pins the donor checkpoint an exploit
  chose until the clone has read it (:func:`tunekit._ray.pin_donor_checkpoint`),
  so ``num_to_keep`` can be as low as 1: the donor saving again, and Ray
  deleting the chosen checkpoint, before the clone reads it loses nothing.

Example:
    >>> from ray import tune
    >>> from tunekit.trainables import DigitsTrainable
    >>> setup = pbt_setup(DigitsTrainable, metric="accuracy", mode="max",
    ...                   perturbation_interval=4, mutations={"lr": tune.loguniform(1e-3, 0.5)})
    >>> setup.checkpoint_config.checkpoint_frequency, setup.tune_config_kwargs()["reuse_actors"]
    (4, True)
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

from ray import tune
from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining, TrialScheduler
from typing_extensions import override

from tunekit import _env, _ray

from tunekit.experiment import record
from tunekit._checks import integer_at_least
from tunekit._ray import PBTWithDonorChoice
from tunekit.errors import ConfigError
from tunekit.trial.hparams import DEFAULT_MUTABLE
from tunekit.trial.kind import declared

__all__ = [
    "PBTSetup", "PopulationBasedTrainingNoIdlePause", "mutable_hyperparameters", "pbt_setup",
    "quiet_pbt_keep_warning"
]


def mutable_hyperparameters(trainable: Any) -> tuple[str, ...]:
    """Hyperparameters ``trainable`` can change in place during a trial.

    tunekit class trainables say so with ``mutable()``; function trainables
    (``function_trainable``) handle :data:`~tunekit.trial.hparams.DEFAULT_MUTABLE`
    unless their session was given other ones.
    """
    base = getattr(trainable, "__wrapped__", trainable)  # tune.with_resources keeps the class
    mutable = getattr(base, "mutable", None)
    if callable(mutable):
        return tuple(mutable())
    return DEFAULT_MUTABLE


class PopulationBasedTrainingNoIdlePause(PBTWithDonorChoice):
    """Ray's PBT, without pausing trials that are not ahead when the population fits the cluster.

    Asynchronous Ray PBT pauses a trial at each perturbation whenever another
    trial is PENDING or PAUSED, to time-share a population larger than the
    cluster and keep its members at a similar pace. A trial is also PENDING
    while its worker starts, and a paused trial makes the next one pause in
    turn: a population that fits the cluster then runs one trial at a time,
    each pausing (and often re-exploiting a paused donor) at every
    perturbation. Measured here: 2 trials on 2 CPUs took 4x the wall time of
    the same sweep without PBT.

    This scheduler pauses a trial, while another waits, only when it is two
    perturbation intervals ahead of the slowest other live trial; otherwise
    it continues. A trial whose peers have run and wait waits for them, as
    PBT needs (one interval of slack, because resuming a paused trial can
    take Ray seconds); peers that have not run and fit the cluster beside
    it are starting their workers and are not waited for (see
    :meth:`choose_trial_to_run` for the workers). A population larger than
    the cluster still time-shares it, each trial holding its slot for two
    intervals instead of one: half the pause/resume cycles of Ray's rule.
    Measured here (8 trials on 2 CPUs, 64 iterations of 60 steps,
    perturbation every 2): 1.04x, 1.07x, 1.04x the sweep without a
    scheduler, every run on both workers (1.80x, 1.23x, 1.55x before the
    workers were kept busy); the paper's toy problem time-shared on one
    slot reached Q = 1.2 in every run, against 1 run in 3 with a pause at
    every perturbation (``benchmarks/README.md``).

    A trial that goes on running and is told to clone a donor does so in its
    own worker (``in_place_exploits``, on by default for tunekit trainables):
    one call - reset to the mutated config, restore the donor's checkpoint -
    is sent to the worker ahead of its next step
    (:func:`tunekit._ray.clone_in_place`). Ray's exploit pauses the trial
    instead, and with nothing else waiting Tune does not keep its worker, so
    the resume starts a new process (about 3 s here). Tune does not track the
    call: a worker that dies meanwhile fails only Tune's own task in flight
    (one failure, retried from the donor's checkpoint with the mutated
    config). Trials that pause anyway (a time-shared population) and
    trainables without ``tunekit_clone`` take Ray's path; so does everything
    with ``in_place_exploits = False``. Measured here (2 trials, 400 steps
    per iteration): 0.95x the sweep without a scheduler, best of 5, against
    1.35x through Ray's pause; the toy problem reached Q >= 1.19 in 4 of 4 runs.

    It also never exploits a donor that is behind: asynchronous Ray PBT lets a
    trial in the lower quantile clone an upper-quantile trial whose last score
    (and checkpoint) is from an earlier iteration, for instance one paused a
    while ago; the trial then goes back in time and re-runs the same
    iterations, again and again while the donor stays paused (seen here: one
    trial re-ran iterations 9-12 twenty times). Such a trial continues instead.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The settings this scheduler's rules read, kept from its own arguments.
        bound = inspect.signature(PopulationBasedTraining.__init__).bind(self, *args, **kwargs)
        bound.apply_defaults()
        self.synch: bool = bool(bound.arguments["synch"])
        self.time_attr: str = bound.arguments["time_attr"]
        self.perturbation_interval: float = bound.arguments["perturbation_interval"]

    @override
    def choose_quantiles(self, trial: Trial, upper: list, lower: list) -> tuple[list, list]:
        if not self.synch and trial in lower:
            now = self.last_scored_time(trial)
            donors = [t for t in upper if self.last_scored_time(t) >= now]
            if donors:
                return donors, lower
            return upper, [t for t in lower if t is not trial]
        return upper, lower

    #: Clone a donor into a trial that keeps running in its own worker (see the class docstring).
    in_place_exploits: bool = True

    @override
    def exploit_in_place(self, trial: Trial) -> bool:
        return self.in_place_exploits and self._continues(trial)

    # The result being handled: (controller, trial, time) while the trial runs
    # asynchronously, and whether it continues, decided at most once and only
    # when needed (at a perturbation), never on the hot path of every result.
    _handling: tuple[Any, Trial, float] | None = None
    _decided: bool | None = None

    @override
    def pauses(self, tune_controller: Any, trial: Trial) -> bool:
        if self.synch:
            return True  # synchronous PBT pauses every trial at a perturbation until the slowest is there
        others = [t for t in tune_controller.get_trials() if t is not trial]
        return any(t.status in (Trial.PENDING, Trial.PAUSED) for t in others) and not self._continues(trial)

    def _continues(self, trial: Trial) -> bool:
        if self._handling is None or self._handling[1] is not trial:
            return False
        if self._decided is None:
            self._decided = self._action(*self._handling) == "continue"
        return self._decided

    def _action(self, tune_controller: Any, trial: Trial, now: float) -> str:
        """What happens to a trial at ``now`` when Ray's PBT would pause it: continue or pause.

        A trial pauses only while another waits and it is two intervals ahead.
        Trials that have not run yet and fit the cluster beside the running ones
        (asked of Ray only then) are not waiting: their workers are starting,
        and a pause would hand this trial's worker to one of them and stop its
        own worker's start (2 trials on 2 CPUs, 60 steps an iteration: one
        worker ran both, pausing every 4 iterations).
        """
        live = [t for t in tune_controller.get_trials() if not t.is_finished()]
        others = [t for t in live if t is not trial]
        waiting = [t for t in others if t.status in (Trial.PENDING, Trial.PAUSED)]
        if not waiting:
            return "continue"  # Ray's PBT pauses only while another trial waits
        if not any(t.status == Trial.PAUSED or self.last_scored_time(t) for t in waiting) \
                and len(live) <= _trials_that_fit(trial):
            return "continue"
        slowest = min((_progress(t, self.time_attr) for t in others), default=now)
        return "continue" if now - slowest < 2 * self.perturbation_interval else "pause"

    @override
    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        record.observe(self, tune_controller.get_trials(), scheduler=True)
        _ray.note_saves(trial, result)
        running = not self.synch and trial.status == Trial.RUNNING
        self._handling = (tune_controller, trial, result.get(self.time_attr, 0)) if running else None
        self._decided = None
        try:
            decision = super().on_trial_result(tune_controller, trial, result)
            if trial in self.exploited_in_place:
                # Cloned in its own worker: the clone was sent there ahead of the next step.
                self.exploited_in_place.discard(trial)
                return TrialScheduler.CONTINUE
            if decision == TrialScheduler.PAUSE and self._continues(trial):
                return TrialScheduler.CONTINUE
            if decision == TrialScheduler.PAUSE:  # its worker is let go after the pause's save: written by then
                _ray.finish_next_save_in_place(trial)
            return decision
        finally:
            self._handling = None

    @override
    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        """Ray's choice (the waiting trial with the least progress), and a second waiting trial staged early.

        Tune asks a worker for the trial chosen here, one trial per controller
        step, and keeps the worker of a trial that pauses only while a chosen
        trial waits for one: when two trials pause in quick succession with one
        trial waiting, the second worker is shut down, its CPU stays idle (the
        waiting trials' requests for new workers are withdrawn each time a
        paused trial's worker is handed over) and a worker is started at the
        end only to be stopped. Measured here (8 trials on 2 CPUs, 32
        iterations of 60 steps): one worker ran the population for the last
        2-3 s of a 10-11 s sweep. So while fewer trials wait than run, a
        paused trial (the least advanced) is chosen to wait as well.

        Once a trial has paused, the trial chosen among those that have not run
        yet (all equally advanced) is the one that asked for a worker last:
        Tune asks in trial order and starts the first ones' workers as CPUs
        allow; the paused trial's worker handed to one of those stops that
        one's own worker from starting, and when the population cycles faster
        than a worker starts, the second CPU never got one (seen in 1 sweep of
        3 here: one worker ran all of it, 1.8x the sweep without PBT).
        """
        first = super().choose_trial_to_run(tune_controller)
        if first is None or first.status != Trial.PENDING or self.synch:
            return first
        trials = tune_controller.get_trials()
        waiting = sum(t.status == Trial.PENDING for t in trials)
        paused = [t for t in trials if t.status == Trial.PAUSED]
        if paused and waiting < sum(t.status == Trial.RUNNING for t in trials):
            return min(paused, key=self.last_scored_time)
        if paused and not self.last_scored_time(first):  # not run: the last to ask for a worker, not a starting one
            return [t for t in trials if t.status == Trial.PENDING and not self.last_scored_time(t)][-1]
        return first

    @override
    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        super().on_trial_complete(tune_controller, trial, result)
        record.observe(self, tune_controller.get_trials(), scheduler=True, force=True)

    @override
    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        super().on_trial_error(tune_controller, trial)
        record.observe(self, tune_controller.get_trials(), scheduler=True, force=True)


def _trials_that_fit(trial: Trial) -> int:
    """How many trials with ``trial``'s resources the cluster holds at once."""
    import ray

    if trial.placement_group_factory is None:  # a stub trial: not known
        return 0
    total = ray.cluster_resources()
    wanted = {k: v for k, v in trial.placement_group_factory.required_resources.items() if v > 0}
    return min((int(total.get(k, 0) // v) for k, v in wanted.items()), default=0)


def _progress(trial: Trial, time_attr: str) -> float:
    return (trial.last_result or {}).get(time_attr, 0) or 0


@dataclass
class PBTSetup:
    """What :func:`pbt_setup` built: pass the pieces to ``tune.Tuner``."""

    scheduler: PopulationBasedTraining
    checkpoint_config: tune.CheckpointConfig
    metric: str
    mode: str

    def tune_config_kwargs(self) -> dict[str, Any]:
        """``tune.TuneConfig(**setup.tune_config_kwargs(), num_samples=...)``."""
        return {"metric": self.metric, "mode": self.mode, "scheduler": self.scheduler, "reuse_actors": True}


def pbt_setup(
    trainable: Any,
    *,
    metric: str,
    mode: Literal["max", "min"],
    perturbation_interval: int,
    mutations: Mapping[str, Any] | None = None,
    custom_explore_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    quantile_fraction: float = 0.25,
    resample_probability: float = 0.25,
    synch: bool = False,
    num_to_keep: int | None = None,
    checkpoint_score_attribute: str | None = None,
    allow_rebuild: tuple[str, ...] = (),
) -> PBTSetup:
    """Build a PBT scheduler, checkpoint config and tune-config arguments that agree.

    Args:
        trainable: The trainable the Tuner runs (used to check the mutations).
        metric, mode: What PBT ranks trials by.
        perturbation_interval: Iterations between perturbations (>= 1); also
            the checkpoint frequency.
        mutations: ``hyperparam_mutations`` for Ray's PBT; every key must be
            a hyperparameter the trainable changes in place.
        custom_explore_fn: Ray's ``custom_explore_fn`` (with or instead of mutations).
        quantile_fraction: Share of the population that exploits / is exploited (0, 0.5].
        resample_probability: Chance to resample instead of perturb, [0, 1].
        synch: Synchronous PBT (all trials perturb together).
        num_to_keep: Checkpoints kept per trial (>= 1, None keeps all).
        checkpoint_score_attribute: Rank kept checkpoints by this metric (in
            ``mode``); the newest checkpoint is always kept as well.
        allow_rebuild: Keys the trainable reads from its config at every step
            (so a mutation takes effect without in-place support); accepted
            in ``mutations`` although not declared mutable.

    Raises:
        ConfigError: an inconsistent or invalid setting, naming it.
    """
    call = "pbt_setup"
    _env.check_all()  # TUNEKIT_CHECKPOINT_WAIT_S is first read at an exploit: refuse a bad value now
    if mode not in ("max", "min"):
        raise ConfigError(f"{call}(mode={mode!r}): expected 'max' or 'min'")
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"{call}(metric={metric!r}): expected a metric name")
    integer_at_least(call, "perturbation_interval", perturbation_interval)
    if not mutations and custom_explore_fn is None:
        raise ConfigError(f"{call}(mutations={mutations!r}): give mutations and/or custom_explore_fn")
    if not 0 < quantile_fraction <= 0.5:
        raise ConfigError(f"{call}(quantile_fraction={quantile_fraction!r}): must be in (0, 0.5]")
    if not 0 <= resample_probability <= 1:
        raise ConfigError(f"{call}(resample_probability={resample_probability!r}): must be in [0, 1]")
    integer_at_least(call, "num_to_keep", num_to_keep, allow_none=True)
    mutable = set(mutable_hyperparameters(trainable)) | set(allow_rebuild)
    unknown = sorted(set(mutations or {}) - mutable)
    if unknown:
        name = getattr(trainable, "__name__", type(trainable).__name__)
        if declared(trainable).train_fn is not None:  # a function_trainable: its mutable= says what it changes
            remedy = (f"declare them with function_trainable({name}, mutable=...) (for the framework "
                      "integrations: tunekit.integrations.transformers.MUTABLE or tunekit.integrations.lightning.MUTABLE), "
                      "or list them in allow_rebuild")
        else:
            remedy = ("declare them in mutable_hyperparameters (and apply them in apply_hyperparameters), "
                      "or list them in allow_rebuild")
        raise ConfigError(
            f"{call}(mutations={sorted(mutations or {})}): {name} cannot change {unknown} in place "
            f"during a trial (it can change {sorted(mutable)}); {remedy}"
        )
    scheduler = PopulationBasedTrainingNoIdlePause(
        time_attr="training_iteration",
        perturbation_interval=perturbation_interval,
        hyperparam_mutations=dict(mutations or {}),
        custom_explore_fn=custom_explore_fn,
        quantile_fraction=quantile_fraction,
        resample_probability=resample_probability,
        synch=synch,
    )
    checkpoint_config = tune.CheckpointConfig(
        checkpoint_frequency=perturbation_interval,
        checkpoint_at_end=True,
        num_to_keep=num_to_keep,
        checkpoint_score_attribute=checkpoint_score_attribute,
        checkpoint_score_order=mode,
    )
    return PBTSetup(scheduler, checkpoint_config, metric, mode)


def quiet_pbt_keep_warning() -> None:
    """Silence Ray's warning about ``num_to_keep <= 2`` with PBT.

    Ray Tune never deletes a trial's newest checkpoint, which is the one an
    exploit clones, so the warning does not apply to setups from :func:`pbt_setup`.
    """
    warnings.filterwarnings("ignore", message=r"Using `CheckpointConfig.num_to_keep <= 2` with PBT")
