"""`tunekit report` as a reader sees it: rendered by headless Chromium, every section and image there."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

from tunekit.analysis._report_plots import segment_starts
from tunekit.analysis.report import hyperparameters, write_report

#: Loaded after the page: counts the images that decoded and records any script error in the DOM.
_PROBE = """
<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || e.type)), true);
const _error = console.error; console.error = (...a) => { window.__errors.push(a.join(' ')); _error(...a); };
window.addEventListener('load', () => {
  const images = [...document.images];
  document.body.dataset.images = images.length;
  document.body.dataset.decoded = images.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.errors = JSON.stringify(window.__errors);
});
</script>
"""

SECTIONS = ["Trials", "Best checkpoint", "Learning curves: accuracy", "Hyperparameters vs final accuracy",
            "PBT exploits", "Ancestry of final weights", "PBT lineage", "Hyperparameter schedules", "TensorBoard"]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="no chromium on this machine (.ci/run installs Debian's chromium)")
def test_report_renders_every_section_and_image_in_a_browser(pbt_experiment, tmp_path):
    summary = write_report(str(pbt_experiment), output=tmp_path / "report", metric="accuracy", mode="max")
    page = summary.html.read_text()
    probe = tmp_path / "report" / "probe.html"
    probe.write_text(page.replace("<head>", "<head>" + _PROBE, 1))
    done = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
         "--enable-logging=stderr", "--v=0", "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    dom = done.stdout
    body = re.search(r"<body([^>]*)>", dom)
    assert body, dom[:2000]
    attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', body.group(1)))
    assert int(attrs["images"]) == len(summary.images) == 4
    assert attrs["decoded"] == attrs["images"], attrs
    assert attrs["errors"] == "[]", attrs
    assert not [line for line in done.stderr.splitlines() if "CONSOLE" in line and "rror" in line]
    headings = re.findall(r"<h2>(.*?)</h2>", dom)
    assert headings == SECTIONS


def test_seeds_and_tunekit_entries_are_not_plotted_as_hyperparameters():
    df = pd.DataFrame({
        "trial_id": ["a", "b", "c"], "training_iteration": [1, 1, 1], "accuracy": [0.1, 0.2, 0.3],
        "config/lr": [0.1, 0.2, 0.3], "config/seed": [1, 2, 3], "config/data_seed": [4, 5, 6],
        "config/tunekit_warm_start/iteration": [1, 2, 3], "config/hidden": [8, 8, 8],
    })
    assert hyperparameters(df) == ["lr"]


def test_a_learning_curve_breaks_where_the_trial_took_a_donors_weights():
    trials = np.array(["a"] * 8 + ["b"] * 3)
    iterations = np.array([1, 2, 3, 4, 5, 6, 9, 10, 1, 2, 3], dtype=float)
    # a: exploited after 4 (a donor at 4) and jumped after 6 (a donor at 8); b: a break of a's is not b's
    starts = segment_starts(trials, iterations, {"a": {4}})
    assert starts.tolist() == [0, 4, 6, 8]
