"""Fashion-MNIST on disk: locate the IDX files, decode them once, cache the result.

Search order (first directory holding all four files wins):
  1. the explicit ``data_dir`` (and ``data_dir/fashion-mnist``),
  2. ``$FEDVEIL_DATA`` (and ``$FEDVEIL_DATA/fashion-mnist``),
  3. the user cache, ``${XDG_CACHE_HOME:-~/.cache}/fedveil/fashion-mnist``
     (where :func:`download_fashion_mnist` puts them by default),
  4. ``/usr/share/datasets/fashion-mnist`` (Debian's ``dataset-fashion-mnist``).

Nothing here touches the network except :func:`download_fashion_mnist`, which only
runs on an explicit user request (``fedveil data download fashion-mnist``).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.request
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fedveil.data.dataset_errors import DatasetDownloadError, DatasetNotFoundError
from fedveil.data.idx import IdxFormatError, read_idx

__all__ = [
    "FASHION_MNIST_CLASSES",
    "FashionMnistArrays",
    "default_download_dir",
    "download_fashion_mnist",
    "find_fashion_mnist",
    "load_fashion_mnist_arrays",
    "search_dirs",
    "user_cache_dir",
]

FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip

# key -> (file stem, ndim, number of records)
_FILES: dict[str, tuple[str, int, int]] = {
    "x_train": ("train-images-idx3-ubyte", 3, 60_000),
    "y_train": ("train-labels-idx1-ubyte", 1, 60_000),
    "x_test": ("t10k-images-idx3-ubyte", 3, 10_000),
    "y_test": ("t10k-labels-idx1-ubyte", 1, 10_000),
}
# Official checksums of the gzip files: MD5 from Zalando's README, SHA-256 as
# published by independent mirrors. Both must match after a download.
_CHECKSUMS: dict[str, tuple[str, str]] = {
    "train-images-idx3-ubyte.gz": (
        "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
    ),
    "train-labels-idx1-ubyte.gz": (
        "25c81989df183df01b3e8a0aad5dffbe",
        "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
    ),
    "t10k-images-idx3-ubyte.gz": (
        "bef4ecab320f06d8554ea6380940ec79",
        "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
    ),
    "t10k-labels-idx1-ubyte.gz": (
        "bb300cfdad3c16e7a12a480ee83cd310",
        "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
    ),
}
DOWNLOAD_MIRRORS = (
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
)
# Module attribute (not a constant inside a function) so tests can point it elsewhere.
SYSTEM_DIRS: tuple[Path, ...] = (Path("/usr/share/datasets/fashion-mnist"),)
_CACHE_FORMAT = 1  # bump when the decoded-cache layout changes


class FashionMnistArrays(NamedTuple):
    x_train: np.ndarray  # uint8, 60000x28x28
    y_train: np.ndarray  # uint8, 60000
    x_test: np.ndarray  # uint8, 10000x28x28
    y_test: np.ndarray  # uint8, 10000
    source: Path  # directory the IDX files came from
    from_cache: bool  # True when the decoded .npz cache was used


def user_cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/fedveil``."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "fedveil"


def default_download_dir() -> Path:
    """Where ``fedveil data download fashion-mnist`` stores files (on the search path)."""
    return user_cache_dir() / "fashion-mnist"


def search_dirs(data_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Candidate directories in search order (existing or not).

    An explicit `data_dir` is the only place looked at: a user who names a
    directory means that one, and silently reading another copy would hide a typo.
    """
    if data_dir is not None:
        return [Path(data_dir), Path(data_dir) / "fashion-mnist"]
    dirs: list[Path] = []
    for base in (os.environ.get("FEDVEIL_DATA") or None,):
        if base is not None:
            dirs += [Path(base), Path(base) / "fashion-mnist"]
    dirs.append(default_download_dir())
    dirs.extend(SYSTEM_DIRS)
    return list(dict.fromkeys(dirs))  # de-duplicate, keep order


def _candidates(directory: Path, stem: str) -> list[Path]:
    # gzip as published, raw after `gunzip`, and the dotted names some mirrors use.
    dotted = stem.replace("-idx", ".idx")
    names = (f"{stem}.gz", stem, f"{dotted}.gz", dotted)
    return [directory / name for name in names]


def _files_in(directory: Path) -> tuple[dict[str, Path], list[str]]:
    found: dict[str, Path] = {}
    missing: list[str] = []
    for key, (stem, _, _) in _FILES.items():
        hit = next((p for p in _candidates(directory, stem) if p.is_file()), None)
        if hit is None:
            missing.append(f"{stem}[.gz]")
        else:
            found[key] = hit
    return found, missing


def find_fashion_mnist(data_dir: str | os.PathLike[str] | None = None) -> dict[str, Path]:
    """Paths of the four IDX files, or DatasetNotFoundError explaining how to get them."""
    searched: list[str] = []
    for directory in search_dirs(data_dir):
        found, missing = _files_in(directory)
        if not missing:
            return found
        note = "" if not found else f" (partial: missing {', '.join(missing)})"
        searched.append(f"  - {directory}{note}")
    raise DatasetNotFoundError(
        "Fashion-MNIST not found. Searched:\n"
        + "\n".join(searched)
        + "\nGet it in one of these ways (nothing is downloaded automatically):\n"
        "  1. apt-get install dataset-fashion-mnist   (Debian/Ubuntu; installs to "
        "/usr/share/datasets/fashion-mnist)\n"
        "  2. fedveil data download fashion-mnist     (explicit download to "
        f"{default_download_dir()})\n"
        "  3. set FEDVEIL_DATA=/path/to/dir holding train-images-idx3-ubyte.gz, "
        "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz "
        "(or a fashion-mnist/ subfolder), or name that directory: `fedveil simulate "
        "--data-dir DIR` (data.data_dir)"
    )


def _decode(files: dict[str, Path]) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for key, (stem, ndim, count) in _FILES.items():
        path = files[key]
        array = read_idx(path, expected_ndim=ndim, expected_dtype=np.uint8)
        if array.shape[0] != count:
            raise IdxFormatError(f"{path}: {array.shape[0]} records in {stem}, expected {count}")
        if ndim == 3 and array.shape[1:] != (28, 28):
            raise IdxFormatError(f"{path}: image size {array.shape[1:]}, expected (28, 28)")
        if ndim == 1 and array.max(initial=0) > 9:
            raise IdxFormatError(f"{path}: label {int(array.max())} out of range, expected 0..9")
        arrays[key] = array
    return arrays


def _cache_path(files: dict[str, Path]) -> Path:
    # Keyed by location, size and mtime: replacing the files invalidates the cache
    # without hashing 30 MB on every load.
    h = hashlib.sha256(f"v{_CACHE_FORMAT}".encode())
    for key in sorted(files):
        st = files[key].stat()
        h.update(f"|{files[key].resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    return user_cache_dir() / "decoded" / f"fashion-mnist-{h.hexdigest()[:20]}.npz"


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in _FILES}
    except (OSError, ValueError, KeyError, EOFError):
        return None  # unreadable cache: decode again and overwrite it
    for key, (_, ndim, count) in _FILES.items():
        a = arrays[key]
        if a.dtype != np.uint8 or a.ndim != ndim or a.shape[0] != count:
            return None
    return arrays


def _write_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write-then-rename so a concurrent reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.part")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)  # uncompressed: loading is then a plain read
        os.replace(tmp, path)
        for stale in path.parent.glob("fashion-mnist-*.npz"):
            if stale != path:
                stale.unlink(missing_ok=True)
    except OSError as exc:  # a read-only home must not break training
        warnings.warn(f"fashion-mnist: could not write decoded cache {path}: {exc}", stacklevel=3)


def load_fashion_mnist_arrays(
    data_dir: str | os.PathLike[str] | None = None, *, use_cache: bool = True
) -> FashionMnistArrays:
    """Decoded uint8 arrays; the second call reads the ``.npz`` cache instead of gunzipping."""
    files = find_fashion_mnist(data_dir)
    source = files["x_train"].parent
    cache = _cache_path(files) if use_cache else None
    arrays = _read_cache(cache) if cache is not None else None
    if arrays is not None:
        return FashionMnistArrays(**arrays, source=source, from_cache=True)
    arrays = _decode(files)
    if cache is not None:
        _write_cache(cache, arrays)
    return FashionMnistArrays(**arrays, source=source, from_cache=False)


def _digests(path: Path) -> tuple[str, str]:
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            md5.update(chunk)
            sha.update(chunk)
    return md5.hexdigest(), sha.hexdigest()


def download_fashion_mnist(
    dest: str | os.PathLike[str] | None = None,
    *,
    base_url: str | None = None,
    timeout: float = 60.0,
) -> Path:
    """Download the four official gzip files into ``dest`` and verify MD5 and SHA-256.

    Only for explicit user requests (the CLI's ``fedveil data download``); loaders and
    tests never call it with a network URL. ``dest`` defaults to
    :func:`default_download_dir`, which is on the loader's search path. Files already
    present with the right checksums are kept. Returns ``dest``.
    """
    target = Path(dest) if dest is not None else default_download_dir()
    target.mkdir(parents=True, exist_ok=True)
    mirrors = (base_url,) if base_url is not None else DOWNLOAD_MIRRORS
    for name, expected in _CHECKSUMS.items():
        final = target / name
        if final.is_file() and _digests(final) == expected:
            continue
        errors: list[str] = []
        for mirror in mirrors:
            url = mirror.rstrip("/") + "/" + name
            part = target / f"{name}.part"
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp, part.open("wb") as fh:
                    for chunk in iter(lambda r=resp: r.read(1 << 20), b""):
                        fh.write(chunk)
            except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, cut-offs
                part.unlink(missing_ok=True)
                errors.append(f"{url}: {exc}")
                continue
            got = _digests(part)
            if got != expected:
                part.unlink(missing_ok=True)
                errors.append(
                    f"{url}: checksum mismatch (md5 {got[0]} != {expected[0]} or "
                    f"sha256 {got[1]} != {expected[1]})"
                )
                continue
            os.replace(part, final)
            break
        else:
            raise DatasetDownloadError(f"could not download {name}:\n  " + "\n  ".join(errors))
    return target
