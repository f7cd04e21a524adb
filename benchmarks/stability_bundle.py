"""What crosses from one device call to the next: a bundle of at most 8 files of at most 15 MiB, named in
letters, digits, '.', '_' and '-' (the limits on what comes back from $OUT), verified by sha256.

    bundle.json        the manifest: generation (one per call), and for each packed folder its parts,
                       sha256 and size
    policy.tar.NN      the exported policy (bf16 HF folder), split in 15 MiB parts; written only when it changed
    study.tgz.NN       the study's results (metrics, configs, logs, report), gzip'ed, checkpoints left out
    call.log           what the call printed

The session copies these files into the committed bundle folder (benchmarks/results/stability_study/bundle/,
which travels with the checkout; a new session starts from a fresh clone, so only a committed bundle crosses
sessions), and the next call reads them back (`unpack`). `carry_size` adds what a call sends (the checkout's
tracked and untracked-but-not-ignored files plus the carried folders) so a call over the 64 MiB limit is
caught before it costs device time.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

PART_BYTES = 15 * 2**20          # the device tool returns files of at most 16 MiB
MAX_FILES = 8
CALL_LIMIT_BYTES = 64 * 2**20     # what one call may send: checkout + carried paths
MANIFEST = "bundle.json"


class BundleError(RuntimeError):
    """A bundle that cannot be read back (a part missing or corrupted) or would not fit the limits."""


def _tar(folder: Path, keep: Callable[[Path], bool], compress: bool) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if compress else "w") as tar:
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if path.is_file() and not path.is_symlink() and keep(rel):
                tar.add(path, arcname=str(rel), recursive=False)
    return buf.getvalue()


def pack(folder: Path, out: Path, name: str, keep: Callable[[Path], bool] = lambda rel: True,
         compress: bool = True, part_bytes: int = PART_BYTES) -> dict:
    """tar (gz) `folder`'s files for which keep(relative path) holds into out/name.00, .01, ...; the entry
    for the manifest."""
    data = _tar(Path(folder), keep, compress)
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for i in range(0, max(len(data), 1), part_bytes):
        part = f"{name}.{i // part_bytes:02d}"
        (out / part).write_bytes(data[i:i + part_bytes])
        parts.append(part)
    return {"parts": parts, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "compressed": compress}


def _joined(bundle: Path, entry: dict) -> tarfile.TarFile:
    """An entry's parts joined and checked against its sha256, opened as a tar."""
    missing = [p for p in entry["parts"] if not (bundle / p).is_file()]
    if missing:
        raise BundleError(f"{bundle}: parts missing: {', '.join(missing)} (copy every file the last call "
                          f"returned into this folder)")
    data = b"".join((bundle / p).read_bytes() for p in entry["parts"])
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise BundleError(f"{bundle}: {entry['parts'][0].rsplit('.', 1)[0]} does not match the sha256 in "
                          f"{MANIFEST} (a part is stale or truncated)")
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:gz" if entry.get("compressed", True) else "r")


def unpack(bundle: Path, entry: dict, dest: Path) -> None:
    """Join an entry's parts, check the sha256, extract into dest (members outside dest are refused)."""
    bundle, dest = Path(bundle), Path(dest)
    with _joined(bundle, entry) as tar:
        dest.mkdir(parents=True, exist_ok=True)
        tar.extractall(dest, filter="data")      # refuses absolute paths, '..' and links out of dest


def read_member(bundle: Path, entry: dict, name: str) -> bytes:
    """One file of a packed entry (checked like `unpack`), without extracting the rest."""
    with _joined(Path(bundle), entry) as tar:
        try:
            member = tar.extractfile(name)
        except KeyError:
            member = None
        if member is None:
            raise BundleError(f"{bundle}: {entry['parts'][0].rsplit('.', 1)[0]} has no file {name!r}")
        return member.read()


def read_manifest(bundle: Path | None) -> dict | None:
    if bundle is None or not (Path(bundle) / MANIFEST).is_file():
        return None
    return json.loads((Path(bundle) / MANIFEST).read_text())


def write_manifest(out: Path, manifest: dict) -> None:
    (Path(out) / MANIFEST).write_text(json.dumps(manifest, indent=2))


def check_out(out: Path) -> list[str]:
    """What in `out` would not come back from a device call (too many files, too large, bad names, too deep)."""
    problems, files = [], [p for p in Path(out).rglob("*") if p.is_file()]
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files (at most {MAX_FILES} come back)")
    for f in files:
        rel = f.relative_to(out)
        if f.stat().st_size > 16 * 2**20:
            problems.append(f"{rel}: {f.stat().st_size} bytes (at most 16 MiB)")
        if len(rel.parts) > 3 or any(not all(c.isalnum() or c in "._-" for c in part) for part in rel.parts):
            problems.append(f"{rel}: too deep or a name outside [A-Za-z0-9._-]")
    total = sum(f.stat().st_size for f in files)
    if total > 64 * 2**20:
        problems.append(f"{total} bytes in all (at most 64 MiB)")
    return problems


def checkout_bytes(repo: Path) -> int:
    """Bytes of what a call sends from the checkout: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "-c", "-o", "--exclude-standard"],
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum((repo / name.decode()).stat().st_size for name in listed
               if name and (repo / name.decode()).is_file())


def carry_size(repo: Path, carried: list[Path]) -> dict:
    """{checkout, carried, total, limit}: bytes one call would send."""
    carried_bytes = sum(f.stat().st_size for c in carried for f in Path(c).rglob("*") if f.is_file())
    checkout = checkout_bytes(Path(repo))
    return {"checkout": checkout, "carried": carried_bytes, "total": checkout + carried_bytes,
            "limit": CALL_LIMIT_BYTES}
