"""Tuning files (stitchcuda.tuning, stitchrt/tuning.h): the runtime's choices by measurement carried
between processes. On the CPU: the runtime's table takes and gives back choices exactly, skipping
what is not a choice; a file made on another device or runtime build is ignored by name; saving
merges with what the folder holds. The GPU test (tests/gpu/test_tuning_gpu.py) shows the effect: a
second process's first call as fast as its tenth."""

from __future__ import annotations

import pytest

from stitchcuda import loader, rt, tuning

CHOICES = "c 0 1 7 8 9\ng 0 3 256 512 1024\ng 1 0 64 64 64\ns 0 1 7 8 9\n"  # s: split-TF32 conv or not


@pytest.fixture
def clean_table():
    rt.tuning_clear()
    yield
    rt.tuning_clear()


def test_choices_round_trip_through_the_runtime(clean_table):
    junk = "g x 1 2\nq 0 1 2\ng 0 -1 5 6\ng 2 0 5 6\ng 0 1 5 six\n\n# a comment\ng 0 1\n"
    assert rt.tuning_import(CHOICES + junk) == 4
    assert sorted(rt.tuning_export().splitlines()) == sorted(CHOICES.splitlines())
    assert rt.tuning_import("g 0 5 256 512 1024\n") == 1  # the same key: the later choice
    assert "g 0 5 256 512 1024" in rt.tuning_export().splitlines()
    rt.tuning_clear()
    assert rt.tuning_export() == ""


def test_a_tuning_file_made_elsewhere_is_ignored_by_name():
    text = tuning.render(CHOICES, "sm_90 132 SMs, cuBLASLt 130100; runtime rtaaaa")
    assert loader.parse_tuning(text, "sm_90 132 SMs, cuBLASLt 130100; runtime rtaaaa") == (CHOICES, "")
    choices, why = loader.parse_tuning(text, "sm_90 132 SMs, cuBLASLt 130200; runtime rtaaaa")
    assert choices == "" and "made on another machine or runtime" in why and "130200" in why
    assert loader.parse_tuning("g 0 1 2 3\n", "x")[1] == "not a stitchcuda tuning file"
    assert "says nothing of where" in loader.parse_tuning(loader.TUNING_HEAD + "\ng 0 1 2\n", "x")[1]


def test_a_program_folder_imports_only_a_file_made_here(tmp_path, monkeypatch, clean_table):
    (tmp_path / tuning.FILE).write_text(tuning.render(CHOICES, "here"))
    monkeypatch.setattr(tuning, "identity", lambda: "elsewhere")
    taken, note = tuning.load(tmp_path)
    assert taken == 0 and "ignored, each new shape is timed" in note and rt.tuning_export() == ""
    monkeypatch.setattr(tuning, "identity", lambda: "here")
    assert tuning.load(tmp_path) == (4, "")
    assert tuning.load(tmp_path / "nothing") == (0, "")


def test_saving_merges_with_the_choices_the_folder_holds(tmp_path, monkeypatch, clean_table):
    rt.tuning_import("g 0 3 1 2 3\n")
    tuning.save(tmp_path, ident="here")
    rt.tuning_clear()
    rt.tuning_import("g 0 4 1 2 3\nc 0 2 9 9\n")  # a newer choice for the first key, and another key
    text = tuning.save(tmp_path, ident="here").read_text()
    assert loader.parse_tuning(text, "here") == ("c 0 2 9 9\ng 0 4 1 2 3\n", "")
    tuning.save(tmp_path, ident="a new machine")  # a file made elsewhere is replaced, not merged
    assert loader.parse_tuning((tmp_path / tuning.FILE).read_text(), "a new machine")[0].count("\n") == 2


def test_a_wheels_loader_imports_the_same_file_through_ctypes(tmp_path, monkeypatch, clean_table):
    """The runtime wheel's loader (no stitchcuda) reads the same format into the same runtime."""
    (tmp_path / tuning.FILE).write_text(tuning.render(CHOICES, "here"))
    monkeypatch.setattr(loader, "tuning_identity", lambda: "here")
    assert loader.import_tuning(tmp_path) == (4, "")
    assert sorted(rt.tuning_export().splitlines()) == sorted(CHOICES.splitlines())
    monkeypatch.setattr(loader, "tuning_identity", lambda: "elsewhere")
    taken, note = loader.import_tuning(tmp_path)
    assert taken == 0 and "made on another machine or runtime" in note
