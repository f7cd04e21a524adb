"""The bundle that crosses device calls: parts under the size limit, verified on the way back, and a check of
what a call's $OUT would lose."""

import pytest
import stability_bundle as B


def test_pack_splits_into_parts_and_unpacks_what_keep_allows(tmp_path):
    src = tmp_path / "src"
    (src / "a" / "checkpoint").mkdir(parents=True)
    (src / "a" / "metrics.jsonl").write_bytes(bytes(range(256)) * 40)      # 10 KB, incompressible-ish
    (src / "a" / "checkpoint" / "model.safetensors").write_bytes(b"x" * 100)
    entry = B.pack(src, tmp_path / "out", "study.tar", keep=lambda rel: "checkpoint" not in rel.parts,
                   compress=False, part_bytes=4096)
    assert len(entry["parts"]) >= 3 and all((tmp_path / "out" / p).stat().st_size <= 4096 for p in entry["parts"])
    B.unpack(tmp_path / "out", entry, tmp_path / "back")
    assert (tmp_path / "back" / "a" / "metrics.jsonl").read_bytes() == (src / "a" / "metrics.jsonl").read_bytes()
    assert not (tmp_path / "back" / "a" / "checkpoint").exists()


def test_a_missing_or_stale_part_is_an_error_naming_it(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_text("data" * 1000)
    entry = B.pack(tmp_path / "src", tmp_path / "out", "p.tgz", part_bytes=512, compress=False)
    (tmp_path / "out" / entry["parts"][1]).write_bytes(b"stale")
    with pytest.raises(B.BundleError, match="does not match the sha256"):
        B.unpack(tmp_path / "out", entry, tmp_path / "back")
    (tmp_path / "out" / entry["parts"][0]).unlink()
    with pytest.raises(B.BundleError, match="parts missing: p.tgz.00"):
        B.unpack(tmp_path / "out", entry, tmp_path / "back")


def test_read_member_reads_one_file_checked_like_unpack(tmp_path):
    """`status --bundle` reads policy.json from the policy's parts this way (it showed 'policy: none yet')."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "policy.json").write_text('{"done": true}')
    (tmp_path / "src" / "model.safetensors").write_bytes(b"w" * 3000)
    entry = B.pack(tmp_path / "src", tmp_path / "out", "policy.tar", compress=False, part_bytes=1024)
    assert B.read_member(tmp_path / "out", entry, "policy.json") == b'{"done": true}'
    with pytest.raises(B.BundleError, match="has no file 'config.json'"):
        B.read_member(tmp_path / "out", entry, "config.json")
    (tmp_path / "out" / entry["parts"][-1]).write_bytes(b"stale")
    with pytest.raises(B.BundleError, match="does not match the sha256"):
        B.read_member(tmp_path / "out", entry, "policy.json")


def test_check_out_names_what_would_not_come_back(tmp_path):
    for i in range(9):
        (tmp_path / f"f{i}").write_text("x")
    (tmp_path / "bad name").write_text("x")
    problems = B.check_out(tmp_path)
    assert any("10 files" in p for p in problems) and any("bad name" in p for p in problems)
