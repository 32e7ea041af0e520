"""The experiment layer: an experiment directory read as data, and what is decided about it.

Owns: the offline read model (trials, states, rows, checkpoints, damage, "best"; read without Ray and
without unpickling), Ray's files read as data, the readers' index, tunekit's own run record and the
experiment's lease, retention planning, ``verify`` and ``gc``. May import: ``tunekit.trial``,
``tunekit.checkpoint``, ``tunekit.storage``, ``tunekit._ray`` and the top-level modules; the readers
import neither Ray nor torch.
"""

from __future__ import annotations

from tunekit._lazy import lazy_exports

_EXPORTS = {
    "tunekit.experiment.gc": ("Deletion", "GcPlan", "delete_planned", "plan_gc"),
    "tunekit.experiment.record": (
        "ExperimentRecorder", "RECORD_NAME", "driver_running", "finish", "in_use_by_another", "interrupted_trials",
        "json_safe", "observe", "read_record", "trial_finished", "write_record"
    ),
    "tunekit.experiment.results": (
        "dedupe_lineage", "exploits_by_trial", "format_ranges", "lost_iterations", "missing_iterations",
        "parse_result_lines", "restore_clones", "rows_lost"
    ),
    "tunekit.experiment.retention": ("Plan", "Policy", "TrialCheckpoints", "newest_first", "plan", "selected"),
    "tunekit.experiment.snapshot": (
        "BestCheckpoint", "CheckpointSummary", "ExperimentSnapshot", "Exploit", "PBT_LOG", "RAY_KEYS",
        "TrialSnapshot", "check_storage", "error_message", "format_counts", "ranked", "read_experiment",
        "read_exploits", "read_state_problems", "registered_checkpoints", "registered_in_state", "trial_tags"
    ),
    "tunekit.experiment.verify": (
        "CheckpointCheck", "ExperimentCheck", "FOREIGN", "checkpoint_at", "experiment_file_problems",
        "result_file_problems", "verify_experiment", "verify_one"
    ),
}
__getattr__, __dir__, _LAZY = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_LAZY)
