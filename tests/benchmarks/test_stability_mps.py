"""The study's MPS switch on a machine without MPS or CUDA: it says why it is off, leaves the environment as it
found it, and stops a daemon it started when no CUDA client can attach."""

import os
import stat

import stability_mps as M


def enter_mps(tmp_path, monkeypatch, control_rc=None, probe=None):
    """Run MPS(...) once: with a stand-in nvidia-cuda-mps-control exiting `control_rc` first on PATH (None: no
    control binary at all) and `probe` as the CUDA client check. Returns (active inside, the log lines, the
    environment's pipe variable inside, the stand-in's calls)."""
    if control_rc is None:
        monkeypatch.setenv("PATH", str(tmp_path))
    else:
        script = tmp_path / M.CONTROL
        script.write_text(f"#!/bin/sh\necho \"$@ $(cat)\" >> {tmp_path}/calls.txt\nexit {control_rc}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    if probe is not None:
        monkeypatch.setattr(M, "PROBE", probe)
    lines = []
    with M.MPS(lines.append, root=tmp_path / "mps") as mps:
        active, pipe = mps.active, os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ          # restored on exit, whatever happened
    calls = tmp_path / "calls.txt"
    return active, lines, pipe, calls.read_text().split("\n")[:-1] if calls.is_file() else []


def test_without_the_control_binary_mps_is_off(tmp_path, monkeypatch):
    active, lines, _, _ = enter_mps(tmp_path, monkeypatch)
    assert not active and "not found" in lines[0] and "time-slicing" in lines[0]


def test_a_daemon_whose_client_cannot_attach_is_stopped(tmp_path, monkeypatch):
    active, lines, _, calls = enter_mps(tmp_path, monkeypatch, 0, "raise SystemExit('no CUDA here')")
    assert not active and "could not attach" in lines[0] and "no CUDA here" in lines[0]
    assert calls == ["-d ", " quit"]                                 # started, then told to quit


def test_a_daemon_that_fails_to_start_leaves_mps_off(tmp_path, monkeypatch):
    active, lines, _, calls = enter_mps(tmp_path, monkeypatch, 3)
    assert not active and "-d failed (rc 3" in lines[0] and calls == ["-d "]


def test_with_a_working_client_mps_is_on_and_quit_at_exit(tmp_path, monkeypatch):
    active, lines, pipe, calls = enter_mps(tmp_path, monkeypatch, 0,
                                           "import os; assert os.environ['CUDA_MPS_PIPE_DIRECTORY']")
    assert active and pipe == str(tmp_path / "mps" / "pipe") and lines[0].startswith("MPS: on")
    assert calls == ["-d ", " quit"]
