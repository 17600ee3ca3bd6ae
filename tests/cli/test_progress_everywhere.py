"""Every long command shows progress through the one ProgressBar: on a terminal that
reports no size as plain lines, and the Dataset's first derivation of classes in a log
or a notebook too."""

from __future__ import annotations

import io

import tqdm.std

from mriprep import MRIDataset
from mriprep.cli import main
from tests.training.fastsurfer_cache import write_cache


class _SizelessTerminal(io.StringIO):
    """stderr under `docker exec -t` or `script`: a terminal of 0 x 0 (tqdm reads -1)."""

    def isatty(self) -> bool:
        return True


def test_the_first_opening_of_a_thick_slice_dataset_says_its_progress(tmp_path, capsys):
    root = write_cache(tmp_path / "c", count=2)
    MRIDataset(root, "train", view="axial", mode="thick_slice")
    err = capsys.readouterr().err
    assert "derive labels: 0/2 subject" in err
    assert "derive labels: 2/2 subject, " in err and "\r" not in err
    MRIDataset(root, "train", view="axial", mode="thick_slice")  # derived: nothing to say
    assert "derive labels" not in capsys.readouterr().err


def test_report_and_export_print_lines_on_a_terminal_of_no_size(tmp_path, monkeypatch):
    root = write_cache(tmp_path / "c", count=2)
    monkeypatch.setattr(tqdm.std, "_screen_shape_wrapper", lambda: (lambda fp: (-1, -1)))
    for command, unit in [(["report", str(root)], "subject"),
                          (["export", str(root), "-o", str(tmp_path / "nii")], "entry")]:
        stream = _SizelessTerminal()
        monkeypatch.setattr("sys.stderr", stream)
        assert main(command) == 0
        said = stream.getvalue()
        assert f"{command[0]}: 2/2 {unit}" in said, said
        assert "\r" not in said
