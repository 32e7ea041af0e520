"""PBT lineage: every exploit placed where the target's own rows show it, and each trial's ancestry.

Implementation tier of :func:`tunekit.analysis._load.pbt_lineage` (which loads the
results and calls :func:`build_lineage`).
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass
from typing import Any

import pandas as pd

from tunekit._checks import is_number
from tunekit._keys import RESTORED_FROM_KEY
from tunekit.analysis._result_frames import ITER, parquet_parts, parts_table, row_config
from tunekit.experiment.results import parse_result_lines
from tunekit.storage._files import read_text
from tunekit.experiment.snapshot import ExperimentSnapshot
from tunekit.storage._location import Storage

__all__ = ["Lineage", "build_lineage"]


@dataclass
class Lineage:
    """PBT history: every exploit, and where each trial's weights came from."""

    #: One row an exploit; ``undone``: the clone's restore fell back to its own checkpoint (the donor's was
    #: gone), so its weights stayed its own (its new config stands).
    exploits: pd.DataFrame
    ancestry: dict[str, list[tuple[str, int, int]]]

    def describe(self, trial_id: str) -> str:
        """``a[1-4] -> b[5-8]``: whose iterations a trial's final weights went through."""
        return " -> ".join(f"{t}[{a}-{b}]" for t, a, b in self.ancestry.get(trial_id, []))


_Logged = list[tuple[int, dict[str, Any], Any]]


def _logged_rows(experiment: Storage, snap: ExperimentSnapshot) -> dict[str, _Logged]:
    """Each trial's (iteration, config, the trial directory a restore before it read) in the order reported,
    re-runs included.

    From the Parquet dataset when there is one (it has every row), else from
    each trial's ``result.json`` (which may lack rows Ray lost).
    """
    out: dict[str, _Logged] = {}
    parts = parquet_parts(experiment)
    if parts:
        table = parts_table(experiment, parts,
                            lambda names: ["trial_id", ITER] + [c for c in names if c.startswith("config/")
                                                                or c == RESTORED_FROM_KEY]).to_pylist()
        for row in table:
            if is_number(row.get(ITER)):
                config = {c[len("config/"):]: v for c, v in row.items() if c.startswith("config/")}
                out.setdefault(str(row["trial_id"]), []).append((int(row[ITER]), config, row.get(RESTORED_FROM_KEY)))
        return out
    for trial in snap.trials:
        text = read_text(experiment.filesystem, posixpath.join(experiment.join(trial.name).path, "result.json"))
        rows, _ = parse_result_lines(text or "")
        out[trial.trial_id] = [
            (int(r[ITER]), r.get("config") if isinstance(r.get("config"), dict) else {}, r.get(RESTORED_FROM_KEY))
            for r in rows if is_number(r.get(ITER))
        ]
    return out


def _has(config: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return bool(wanted) and all(
        k in config and (config[k] == v or (is_number(config[k]) and is_number(v) and math.isclose(config[k], v)))
        for k, v in wanted.items()
    )


def _fix_exploit_iterations(experiment: Storage, snap: ExperimentSnapshot, records: list[dict[str, Any]]) -> None:
    """Place each exploit where the target's own rows show it happened.

    Ray logs iterations as of its decision, which with ``synch=True`` can lag
    both the checkpoint actually cloned and the target's own iteration. The
    target's rows are the truth: the first row after the exploit carries the
    new config, and continues from the cloned checkpoint (iteration k+1 after
    a checkpoint of iteration k). Where the config did not visibly change,
    the row after the logged iteration is used; where the target's rows begin
    after its first exploit (Ray lost the ones before), the first row left is
    the first after it; where the rows around an
    exploit are missing, Ray's logged values stay. An exploit whose first row says the trial restored its own
    checkpoint (tunekit's trainables report whose they read) is undone.
    """
    if not records:
        return
    logged = _logged_rows(experiment, snap)
    names = {t.trial_id: t.name for t in snap.trials}
    position: dict[str, int] = {}
    for record in records:
        rows = logged.get(record["target"], [])
        start = max(position.get(record["target"], 0), 1)
        keys = {k for _, cfg, _ in rows for k in cfg}
        wanted = {k: v for k, v in (record["new_config"] or {}).items()
                  if k in keys and (is_number(v) or isinstance(v, (str, bool)))}
        hit = next(
            (j for j in range(start, len(rows)) if _has(rows[j][1], wanted) and not _has(rows[j - 1][1], wanted)),
            None,
        )
        if hit is None and rows and record["target"] not in position and rows[0][0] > 1 and _has(rows[0][1], wanted):
            # The target's rows begin after its first exploit, with the new config: Ray's JSON logger copied the
            # trial's older result.json from storage over its own as the clone restored (a race with its upload),
            # so the rows before were lost, and the first one left is the first the clone reported (the logged
            # iteration of the exploit stays: no row before it is left).
            hit = 0
        if hit is None:  # no visible config change: the row after the logged iteration
            hit = next((j for j in range(start, len(rows)) if rows[j - 1][0] == record["iteration"]), None)
        if hit is None:
            continue
        if hit:
            record["iteration"] = rows[hit - 1][0]
        record["undone"] = rows[hit][2] is not None and rows[hit][2] == names.get(record["target"])
        if not record["undone"]:  # (undone: the row continues the trial's own checkpoint, not the donor's)
            record["source_iteration"] = rows[hit][0] - 1
        position[record["target"]] = hit + 1


def build_lineage(experiment: Storage, snap: ExperimentSnapshot, df: pd.DataFrame) -> Lineage:
    """The :class:`Lineage` of ``snap``'s exploits, ``df`` being its results (:func:`tunekit.load_results`)."""
    current: dict[str, dict[str, Any]] = {}
    targets = {exploit.target for exploit in snap.exploits}  # (the trials whose config an exploit replaced)
    firsts = df.groupby("trial_id", sort=False).head(1).set_index("trial_id") if not df.empty and targets else None
    for trial in snap.trials:
        if trial.trial_id not in targets:
            continue
        if firsts is not None and trial.trial_id in firsts.index:
            current[trial.trial_id] = row_config(firsts.loc[trial.trial_id])
        else:
            current[trial.trial_id] = dict(trial.config)
    records = []
    for exploit in snap.exploits:
        old = dict(current.get(exploit.target, {}))
        current[exploit.target] = {**old, **exploit.new_config}
        records.append(
            {
                "iteration": exploit.iteration,
                "target": exploit.target,
                "source": exploit.source,
                "source_iteration": exploit.source_iteration,
                "old_config": old,
                "new_config": exploit.new_config,
                "undone": False,
            }
        )
    _fix_exploit_iterations(experiment, snap, records)
    exploits = pd.DataFrame.from_records(
        records, columns=["iteration", "target", "source", "source_iteration", "old_config", "new_config", "undone"]
    )
    final = {t.trial_id: t.iterations for t in snap.trials}

    def chain(trial: str, upto: int, before: int) -> list[tuple[str, int, int]]:
        for k in range(before - 1, -1, -1):
            record = records[k]
            if record["target"] == trial and not record["undone"] and record["source_iteration"] <= upto:
                start = record["source_iteration"] + 1
                own = [(trial, start, upto)] if start <= upto else []
                return chain(record["source"], record["source_iteration"], k) + own
        return [(trial, 1, upto)] if upto >= 1 else []

    ancestry = {t: chain(t, n, len(records)) for t, n in final.items()}
    return Lineage(exploits, ancestry)
