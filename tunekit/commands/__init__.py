"""The commands layer: one module per ``tunekit`` verb (``quickstart``, ``status``, ``verify``, ``report``,
``resume`` with ``extend``, ``gc``, ``check``), each with the function that runs it from parsed arguments.

Owns: what each verb prints and its exit code; finding an experiment's trainable without unpickling it;
starting Ray for a command (a local one of its own unless an address is named); resuming an experiment
around Ray's own files; ``tunekit check``'s runs. ``tunekit.cli`` only parses and calls these. May import:
every layer below it (``quickstart`` also runs ``tunekit.trainables``' reference sweep).
"""

from __future__ import annotations

from tunekit._lazy import lazy_exports

_EXPORTS = {
    "tunekit.commands.check": (
        "CheckReport", "add_parser", "as_trainable_class", "check_resume", "flatten", "parse_config", "run_cli"
    ),
    "tunekit.commands.extend": ("extend_experiment",),
    "tunekit.commands.gc": ("gc_command",),
    "tunekit.commands.quickstart": ("quickstart_command",),
    "tunekit.commands.report": ("report_command",),
    "tunekit.commands.resume": (
        "ResumeSummary", "find_trainable", "import_trainable", "keep_pbt_log", "newest_good", "resume_command",
        "resume_experiment"
    ),
    "tunekit.commands.status": ("status_command",),
    "tunekit.commands.verify": ("verify_command",),
}
__getattr__, __dir__, _LAZY = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_LAZY)
