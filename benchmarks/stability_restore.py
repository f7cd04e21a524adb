"""The stability study across device calls (benchmarks/stability_study.py drives it): restore the study from
the device disk (a warm machine) or the carried bundle, and pack it into the call's $OUT (stability_bundle.py
is the bundle format; stability_spec.py the study's state).

Imported by stability_study.py after it has put benchmarks/ and scripts/ on sys.path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import stability_bundle as B
from stability_spec import Study, timestamp


def restore(work: Path, bundle: Path | None, spec: dict | None, log) -> Study:
    """The study to continue: the device disk when it is at least as new as the bundle (a warm machine), else
    the bundle unpacked into a clean `work`; a new study from `spec` when there is neither."""
    manifest = B.read_manifest(bundle)
    local = Study.load(work)
    if local is not None and (manifest is None or local.generation >= manifest["generation"]):
        log(f"restored from the device disk (generation {local.generation}: the machine was warm)")
        return local
    if work.exists():
        shutil.rmtree(work)
    if manifest is None:
        if spec is None:
            raise SystemExit("no study in --work or --bundle: start one with --preset gpu (or smoke)")
        study = Study(work, spec)
        study.save()
        log(f"new study ({spec['preset']}) in {work}")
        return study
    B.unpack(bundle, manifest["study"], work)
    if manifest.get("policy"):
        B.unpack(bundle, manifest["policy"], work / "policy")
    B.write_manifest(work, manifest)            # what the carried bundle holds (the policy need not travel back)
    study = Study.load(work)
    log(f"restored from the bundle (generation {study.generation}; fresh machine: checkpoints are not carried)")
    return study


def _keep_in_bundle(rel: Path) -> bool:
    parts = rel.parts
    if parts[0] in ("policy", B.MANIFEST) or any(p.startswith("checkpoint") for p in parts):
        return False
    return not (parts[0] == "runs" and rel.name in ("curves.png",)) and not rel.name.endswith(".tmp")


def pack_bundle(study: Study, out: Path) -> dict:
    """study.tgz parts always; policy.tar parts only when the policy differs from the one the carried bundle
    already holds (its policy.json, which names the weights' sha256, is compared)."""
    import hashlib

    out.mkdir(parents=True, exist_ok=True)
    last = B.read_manifest(study.work) or {}
    manifest = {"generation": study.generation, "created": timestamp(), "policy": None}
    policy_json = study.policy / "policy.json"
    if policy_json.is_file():
        digest = hashlib.sha256(policy_json.read_bytes()).hexdigest()
        carried = last.get("policy")
        manifest["policy"] = carried if carried and carried.get("policy_json_sha256") == digest else {
            **B.pack(study.policy, out, "policy.tar", compress=False), "policy_json_sha256": digest}
    B.write_manifest(study.work, manifest)      # in study.tgz too: the next call reads it from either place
    manifest["study"] = B.pack(study.work, out, "study.tgz", _keep_in_bundle, compress=True)
    B.write_manifest(out, manifest)
    return manifest


def study_from_bundle(bundle: Path, into: Path) -> Study:
    manifest = B.read_manifest(bundle)
    if manifest is None:
        raise SystemExit(f"{bundle}: no {B.MANIFEST} (copy the files of the last call's $OUT there)")
    if into.exists():
        shutil.rmtree(into)
    B.unpack(bundle, manifest["study"], into)
    study = Study.load(into)
    if manifest.get("policy"):         # the policy's parts are not unpacked here: only its policy.json is read
        study.carried_policy = json.loads(B.read_member(bundle, manifest["policy"], "policy.json"))
    return study
