"""benchmarks/skfix.py's --precompile-only exit code on CPU: 1 when a binary failed to compile (so skfix_h200.sh's
`precompile_rc` reports it), 0 when all compiled; the device query and the compile jobs are stood in for."""

import sys
from types import SimpleNamespace

import pytest
import skfix  # noqa: E402


@pytest.mark.parametrize("errors,rc", [([], 0), (["('nvfp4', 4096, 12288, 256, 'sk2'): boom"], 1)])
def test_precompile_only_exit_code(monkeypatch, capsys, errors, rc):
    monkeypatch.setattr(skfix.torch.cuda, "get_device_properties", lambda i: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(skfix, "precompile", lambda Ms, fmts: list(errors))
    monkeypatch.setattr(sys, "argv", ["skfix.py", "--precompile-only", "--out", "/dev/null"])
    assert skfix.main() == rc
    assert "'errors': " + repr(errors) in capsys.readouterr().out
