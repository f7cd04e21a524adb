"""The study's MPS switch on a machine without MPS or CUDA: it says why it is off, leaves the environment as it
found it, and stops a daemon it started when no CUDA client can attach."""

import os
import stat

import stability_mps as M


def fake_control(folder, rc=0):
    """A stand-in nvidia-cuda-mps-control that records how it was called."""
    script = folder / M.CONTROL
    script.write_text(f"#!/bin/sh\necho \"$@ $(cat)\" >> {folder}/calls.txt\nexit {rc}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder / "calls.txt"


def test_without_the_control_binary_mps_is_off(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    lines = []
    with M.MPS(lines.append, root=tmp_path / "mps") as mps:
        assert not mps.active
    assert "not found" in lines[0] and "time-slicing" in lines[0]
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_a_daemon_whose_client_cannot_attach_is_stopped(tmp_path, monkeypatch):
    calls = fake_control(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(M, "PROBE", "raise SystemExit('no CUDA here')")
    lines = []
    with M.MPS(lines.append, root=tmp_path / "mps") as mps:
        assert not mps.active
    assert "could not attach" in lines[0] and "no CUDA here" in lines[0]
    assert calls.read_text().split("\n")[:2] == ["-d ", " quit"]           # started, then told to quit
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_a_daemon_that_fails_to_start_leaves_mps_off(tmp_path, monkeypatch):
    fake_control(tmp_path, rc=3)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    lines = []
    with M.MPS(lines.append, root=tmp_path / "mps") as mps:
        assert not mps.active
    assert "-d failed (rc 3" in lines[0]


def test_with_a_working_client_mps_is_on_and_quit_at_exit(tmp_path, monkeypatch):
    calls = fake_control(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(M, "PROBE", "import os; assert os.environ['CUDA_MPS_PIPE_DIRECTORY']")
    lines = []
    with M.MPS(lines.append, root=tmp_path / "mps") as mps:
        assert mps.active and os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "pipe")
    assert lines[0].startswith("MPS: on") and "quit" in calls.read_text()
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
