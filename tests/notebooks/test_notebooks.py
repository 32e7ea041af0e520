"""The example notebooks execute top to bottom (nbclient), with small settings."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SMALL = {
    "quickstart.ipynb": "NUM_SAMPLES = 2\nMAX_ITERATIONS = 3\nSTORAGE = None",
    "pbt_analysis.ipynb": "NUM_SAMPLES = 4\nMAX_ITERATIONS = 4\nINTERVAL = 2",
    "lightning.ipynb": "NUM_SAMPLES = 2\nEPOCHS = 3",
    "transformers.ipynb": "LEARNING_RATES = [1e-3, 3e-3]\nEPOCHS = 2",
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_notebook_executes(name, tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "a notebook has exactly one parameters cell"
    params[0].source = SMALL[name]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(NOTEBOOKS.parent), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(
        o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    if name == "quickstart.ipynb":
        assert "validation accuracy of the loaded model:" in outputs and "best trial:" in outputs
    elif name == "lightning.ipynb":
        assert "accuracy of the loaded model:" in outputs and "continued: [4, 5] val_accuracy" in outputs
        assert re.search(r"(\d+) checkpoints in 2 trials: \1 good", outputs)  # tunekit verify: all good
    elif name == "transformers.ipynb":
        assert "trainer checkpoint files: ['optimizer.pt', 'pytorch_model.bin', 'rng_state.pth'," in outputs
        assert re.search(r"(\d+) checkpoints in 2 trials: \1 good", outputs)
    else:
        assert "index.html" in outputs and "->" in outputs  # ancestry of an exploited trial
        assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
