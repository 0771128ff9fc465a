"""A labelled image folder from an archive: a zip or a tar (compressed or not), a path or an http(s) URL, extracted
once into `data_dir`. datamodules/image_folder.py loads it when `data_dir` is missing or empty and `archive` is given
(configs/birds.yaml names the Azure ML tutorial's fowl_data.zip):

    python -m scripts.train fit --config configs/birds.yaml --data.init_args.data_dir fowl_data
"""

from __future__ import annotations

import lzma
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path

from datamodules.errors import DataError
from datamodules.preprocessing.images import hidden


def fetch_archive(archive: str, target: Path) -> None:
    """Extracts `archive` (a path or http(s) URL of a zip or a tar, compressed or not) into `target`, once.

    Extraction goes to a temporary folder beside `target` that is renamed into place, so
    `target` is either absent or complete, and processes racing to create it cannot mix
    files. An archive holding one top folder (`fowl_data/train/...`) gives that folder's content.
    """
    if target.is_dir() and any(target.iterdir()):
        return
    # A target that is a file (or lies below one) ended, after the whole extraction, in the rename's traceback.
    blocked = next((path for path in (target, *target.parents) if path.exists() and not path.is_dir()), None)
    if blocked is not None:
        raise DataError(
            f"{target}: {'' if blocked == target else f'{blocked} is '}a file, not a folder; give "
            f"data.init_args.data_dir a folder to extract {archive} into"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as temp:
        temp = Path(temp)
        if archive.startswith(("http://", "https://")):
            source = temp / "download"
            try:
                with urllib.request.urlopen(archive, timeout=60) as response, source.open("wb") as file:
                    shutil.copyfileobj(response, file)
            except (urllib.error.URLError, OSError) as error:
                raise DataError(
                    f"{archive}: download failed ({getattr(error, 'reason', error)}); put the images in "
                    f"{target} yourself or set data.init_args.archive to a local copy"
                ) from None
        else:
            source = Path(archive)
            if not source.is_file():
                raise DataError(f"{archive}: no such archive; give data.init_args.archive an existing .zip or .tar.gz")
        unpacked = temp / "unpacked"
        extract(source, unpacked, archive)
        entries = [p for p in unpacked.iterdir() if not hidden(p, unpacked)]
        root = entries[0] if len(entries) == 1 and entries[0].is_dir() else unpacked
        try:
            root.rename(target)
        except OSError:
            if not target.is_dir():  # else another process finished first: its copy is as good
                raise


def extract(source: Path, folder: Path, archive: str) -> None:
    """Extracts the zip or tar (gzip, bzip2, xz or none) `source` into `folder`, checked whole: a DataError naming
    `archive` and the reason when it is damaged or cut short, so no damaged image is trained on without a word."""
    with source.open("rb") as file:
        zip_like = file.read(2) == b"PK"  # a zip begins with its first member's header, and ends with its directory
    try:
        if zip_like or zipfile.is_zipfile(source):
            if not zipfile.is_zipfile(source):
                raise DataError(
                    f"{archive}: a zip archive without its central directory (cut short?); download it again"
                )
            with zipfile.ZipFile(source) as archive_file:
                archive_file.extractall(folder)  # checks each member's CRC-32; drops ".." and absolute parts of names
            return
        with tarfile.open(source) as archive_file:
            archive_file.extractall(folder, filter="data")  # refuses paths outside, links out, devices
            # tarfile stops at the archive's end marker; the compressed stream's own check (gzip's CRC-32, xz's and
            # bzip2's) runs only when it is read to its very end.
            while archive_file.fileobj.read(1 << 20):
                pass
    except tarfile.ReadError as error:
        if "could not be opened successfully" in str(error):  # its multi-line list of the formats tried
            raise DataError(f"{archive}: neither a zip nor a tar archive; give a .zip, .tar or .tar.gz") from None
        raise DataError(f"{archive}: a damaged or cut-short tar archive ({error}); download it again") from None
    except OSError as error:
        if error.errno is not None:  # the system's: a full disk, no permission
            raise DataError(
                f"{archive}: cannot be extracted into {folder.parent} ({error}); free space there"
            ) from None
        raise damaged(archive, error) from None  # gzip's "CRC check failed", bzip2's "Invalid data stream"
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, NotImplementedError,
            RuntimeError) as error:  # fmt: skip
        raise damaged(archive, error) from None


def file_as_data_dir(path: Path, archive: str | None = None) -> DataError:
    """The one line for a file given as data_dir: an archive (by its bytes) is to be given as `archive`, with the
    folder to extract it into; any other file is no folder of images, nor one to extract a local `archive` into (the
    tutorial's URL, which the birds config names, is not what the user gave)."""
    kind = "zip" if zipfile.is_zipfile(path) else "tar" if tarfile.is_tarfile(path) else None
    if kind is None and archive is not None and "://" not in archive:  # a file of the user's, not the tutorial's URL
        return DataError(
            f"{path}: a file, not a folder; give data.init_args.data_dir a folder to extract {archive} into"
        )
    if kind is None:
        return DataError(
            f"{path}: a file, not a folder; give data.init_args.data_dir a folder of labelled images (a folder of "
            "images per class, or train/ and val/ of them)"
        )
    folder = path.parent / (path.name.split(".")[0] or "images")  # my_photos.tar.gz: my_photos
    return DataError(
        f"{path}: a {kind} archive, not a folder; give it as data.init_args.archive {path}, and "
        f"data.init_args.data_dir the folder to extract it into (e.g. {folder})"
    )


def damaged(archive: str, error: BaseException) -> DataError:
    return DataError(f"{archive}: damaged or cut short ({error}); download it again")
