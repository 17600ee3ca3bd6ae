"""The reference training script, run as a user runs it: on the demo cache, on CPU, with 2
loader workers and the default bfloat16 autocast."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mriprep.cache import Cache
from tests.cache_clone import clone_cache, read_array, replace_array, rerecord

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_2p5d.py"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_reference_training_runs_on_the_demo_cache_with_falling_loss(demo_cache, tmp_path):
    metrics = tmp_path / "metrics.json"
    done = run_script(str(demo_cache.path), "--epochs", "2", "--steps-per-epoch", "10",
                      "--workers", "2", "--val-slices", "32", "--metrics", str(metrics))
    assert done.returncode == 0, done.stderr
    history = json.loads(metrics.read_text())
    loss = np.array(history["loss"])
    assert len(loss) == 20 and np.isfinite(loss).all()
    assert loss[-5:].mean() < 0.9 * loss[:5].mean(), loss
    assert "autocast torch.bfloat16" in done.stdout
    last = history["epochs"][-1]["val_dice"]
    assert set(last) == {str(v) for v in history["classes"]}
    # Background and white matter are learnt within 20 steps; each Dice is a real ratio.
    assert last["0"] > 0.5 and all(d is None or 0.0 <= d <= 1.0 for d in last.values())
    assert "val Dice per label" in done.stdout


def test_reference_training_stops_naming_the_subject_of_a_non_finite_input(
        demo_cache, tmp_path):
    clone = clone_cache(demo_cache.path, tmp_path / "cache")
    train = Cache(clone.root).entries("train")
    victim = train[0]
    path = clone.tensor_path(victim.key, "image")
    image = read_array(path)
    image[:, 100, 90] = np.nan  # a NaN on every sagittal slice of one subject
    replace_array(path, image)
    rerecord(clone, victim.key, "image")  # its new size recorded: only the values tell
    done = run_script(str(clone.root), "--epochs", "1", "--steps-per-epoch", "40",
                      "--workers", "2", "--amp", "off", "--batch-size", "4")
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert victim.subject_id in done.stderr and "non-finite" in done.stderr
