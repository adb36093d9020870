"""Carry Triton's compiled kernels from one GPU call to the next: the device machine starts bare, and
compiling is most of the GPU tests' time (their slowest tests, 40-70 s each on tiny shapes, are float32
compiles: docs/benchmarks/gpu_tests.txt) and of the benchmark's correctness check (2-3 min).

    python benchmarks/triton_cache.py pack ARCHIVE [--cache DIR] [--max-mb 15]   # on the GPU host, into $OUT
    python benchmarks/triton_cache.py unpack ARCHIVE [--cache DIR]               # there, before a kernel runs

``gpu_session.sh`` does both: ``TRITON_CACHE_OUT=1`` packs the call's cache into
``$OUT/triton_cache.tgz``; a ``.triton-gpu-cache.tgz`` carried in the repository root is unpacked first.

Triton finds a kernel by a hash of its source, its specialisation, the compile options and the Triton
and ptxas versions, so an entry made from another tree or on another host is never hit, and never wrong.
Only what a launch loads travels: the cubin, the metadata JSON, the group index and the compiled C
launchers (``.so``); the PTX and intermediate IRs, most of the bytes, stay behind. Triton's group index
names its files by absolute path (``FileCacheManager.get_group`` keeps those that exist), so unpack
rewrites them to the new folder. (Triton's remote cache backends need a server the device machine
cannot reach; its ``TRITON_STORE_BINARY_ONLY`` would drop the IRs too, but only for kernels compiled
with it set, and the group paths would still name the old folder.)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
from pathlib import Path

# what a cache hit reads: the kernel's binary (cubin; hsaco on ROCm), its metadata and group index (.json),
# and the C launchers Triton builds per signature (.so with Python's suffix)
KEPT_SUFFIXES = (".cubin", ".hsaco", ".json", ".so")
GROUP_PREFIX = "__grp__"
PACK_MARGIN = 2 ** 20  # bytes pack leaves below its cap: gzip's buffer and the entry being added


def default_cache_dir() -> Path:
    """Where Triton keeps its cache: ``TRITON_CACHE_DIR``, else ``$TRITON_HOME/.triton/cache`` (home by default)."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return Path(os.environ["TRITON_CACHE_DIR"])
    return Path(os.environ.get("TRITON_HOME", os.path.expanduser("~"))) / ".triton" / "cache"


def _kept(path: Path) -> bool:
    return path.is_file() and path.name.endswith(KEPT_SUFFIXES) and not path.name.endswith(".tmp")


def pack(cache: Path, archive: Path, max_bytes: int) -> tuple[int, int]:
    """Write ``archive`` (tar.gz) with the loadable files of ``cache``, whole entries (one hash folder each),
    newest first, until the archive reaches ``max_bytes`` less a margin for what gzip still buffers
    (cubins compress about 4x: 124 kernels' 28.5 MB to 7 MB); returns (entries, uncompressed bytes)."""
    entries = sorted((d for d in cache.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
    total = count = 0
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for entry in entries:
            files = [f for f in entry.iterdir() if _kept(f)]
            if not files:
                continue
            if raw.tell() + PACK_MARGIN > max_bytes:
                break
            for f in files:
                tar.add(f, arcname=f"{entry.name}/{f.name}")
                total += f.stat().st_size
            count += 1
    return count, total


def unpack(archive: Path, cache: Path) -> int:
    """Extract ``archive`` into ``cache`` and point every group index at the files there; returns the
    number of entries."""
    cache.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and len(Path(m.name).parts) == 2
                   and not Path(m.name).is_absolute() and ".." not in Path(m.name).parts]
        tar.extractall(cache, members=members)
    entries = {Path(m.name).parts[0] for m in members}
    for entry in entries:
        for grp in (cache / entry).glob(f"{GROUP_PREFIX}*.json"):
            data = json.loads(grp.read_text())
            data["child_paths"] = {name: str(cache / entry / Path(path).name)
                                   for name, path in data.get("child_paths", {}).items()}
            grp.write_text(json.dumps(data))
    return len(entries)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack", help="the cache's loadable files into ARCHIVE")
    p.add_argument("archive", type=Path)
    p.add_argument("--max-mb", type=float, default=15.0, help="the archive's size cap, newest entries first "
                   "(the device tool returns files of 16 MiB at most)")
    u = sub.add_parser("unpack", help="ARCHIVE into the cache folder, group paths rewritten")
    u.add_argument("archive", type=Path)
    for q in (p, u):
        q.add_argument("--cache", type=Path, default=None, help="Triton's cache folder (default: as Triton finds it)")
    a = ap.parse_args(argv)
    cache = a.cache or default_cache_dir()
    if a.verb == "pack":
        if not cache.is_dir():
            print(f"triton_cache: no cache folder {cache}", file=sys.stderr)
            return 1
        count, size = pack(cache, a.archive, int(a.max_mb * 2 ** 20))
        print(f"triton_cache: {count} kernels, {size / 2 ** 20:.1f} MiB of binaries and metadata -> {a.archive} "
              f"({a.archive.stat().st_size / 2 ** 20:.1f} MiB)")
        return 0
    if not a.archive.is_file():
        print(f"triton_cache: no archive {a.archive}", file=sys.stderr)
        return 1
    try:
        count = unpack(a.archive, cache)
    except (tarfile.TarError, OSError, json.JSONDecodeError) as exc:
        print(f"triton_cache: {a.archive}: cannot unpack ({exc}); the kernels compile as usual", file=sys.stderr)
        return 1
    print(f"triton_cache: {count} kernels from {a.archive} -> {cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
