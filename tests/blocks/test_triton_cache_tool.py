"""``benchmarks/triton_cache.py`` without Triton: what pack keeps, its size cap, the group paths unpack
rewrites, and a bad archive's one-line error. (That Triton then loads the unpacked kernels instead of
compiling them: ``test_kernels_host_triton.py``, with the GPU host's Triton.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = [sys.executable, str(ROOT / "benchmarks" / "triton_cache.py")]


def _fake_cache(root: Path, entries: int, cubin_bytes: int) -> Path:
    """A Triton-like cache: per entry a hash folder with a cubin of random (incompressible) bytes, its
    metadata, PTX and IR, and a group index naming them by absolute path; mtimes ascending by entry."""
    for i in range(entries):
        entry = root / f"HASH{i:03d}"
        entry.mkdir(parents=True)
        files = {"k.cubin": os.urandom(cubin_bytes), "k.json": b"{}", "k.ptx": b"ptx" * 1000, "k.ttir": b"ir"}
        for name, data in files.items():
            (entry / name).write_bytes(data)
        (entry / "__grp__k.json").write_text(json.dumps({"child_paths": {n: str(entry / n) for n in files}}))
        for f in entry.iterdir():
            os.utime(f, (1000 + i, 1000 + i))
        os.utime(entry, (1000 + i, 1000 + i))
    return root


def test_pack_keeps_what_a_launch_loads_newest_first_within_its_cap_and_unpack_repoints_the_groups(tmp_path):
    cache = _fake_cache(tmp_path / "cache", entries=6, cubin_bytes=700_000)
    archive = tmp_path / "out" / "cache.tgz"
    run = subprocess.run([*TOOL, "pack", str(archive), "--cache", str(cache), "--max-mb", "3.5"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert archive.stat().st_size <= 3.5 * 2 ** 20
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    kept = sorted({n.split("/")[0] for n in names})
    assert 1 <= len(kept) < 6 and kept == [f"HASH{i:03d}" for i in range(6 - len(kept), 6)]  # the newest
    assert {n.split("/")[1] for n in names} == {"k.cubin", "k.json", "__grp__k.json"}  # no PTX, no IR
    assert run.stdout.startswith(f"triton_cache: {len(kept)} kernels")

    target = tmp_path / "elsewhere"
    run = subprocess.run([*TOOL, "unpack", str(archive), "--cache", str(target)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith(f"triton_cache: {len(kept)} kernels"), run.stderr
    group = json.loads((target / kept[0] / "__grp__k.json").read_text())["child_paths"]
    # every child points into the new folder; those left behind (PTX, IR) name files that do not exist there,
    # which Triton's get_group skips
    assert all(Path(p).parent == target / kept[0] for p in group.values())
    assert {n for n, p in group.items() if Path(p).exists()} == {"k.cubin", "k.json"}


def test_a_bad_archive_or_cache_folder_is_one_line(tmp_path):
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"not a tarball")
    run = subprocess.run([*TOOL, "unpack", str(bad), "--cache", str(tmp_path / "c")], capture_output=True, text=True)
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1 and "cannot unpack" in run.stderr
    run = subprocess.run([*TOOL, "pack", str(tmp_path / "o.tgz"), "--cache", str(tmp_path / "none")],
                         capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.strip() == f"triton_cache: no cache folder {tmp_path / 'none'}"
