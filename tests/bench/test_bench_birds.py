"""scripts/bench/birds.py runs end to end on the CPU (tiny photos, batches and network input): every line it promises,
each run's rate as it is measured, each rate positive, the photos past the unique ones hard links. Times are not checked
(the bench is where they are read; docs/measured.md has the GPU's).

.venv/bin/python -m pytest -q tests/bench/test_bench_birds.py
"""

from __future__ import annotations

import re

import pytest

from tests.bench.printed import assert_every_round
from tests.conftest import run_module

LINES = (
    "decode: PIL (ImageFolder + PILToTensor)", "decode: Pillow, ImageFolderDataModule's ImageFiles",
    "loader alone: ImageFolderDataModule's batches", "template: JPEGs through ImageFolderDataModule",
    "synthetic: tensors on cpu, plain loop",
)  # fmt: skip
RATIOS = ("datamodule / ImageFolder decoding", "loader alone / synthetic", "pipeline / synthetic")


@pytest.mark.slow  # two short fits of efficientnet_lite0 on 64 px crops, one DataLoader worker
def test_prints_every_rate_and_ratio():
    args = ("--batches", "2", "--batch-size", "4", "--images", "6", "--image-size", "64", "--num-workers", "1")
    result = run_module("scripts.bench.birds", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    assert_every_round(printed, LINES, "images/s", rounds=1)
    assert "birds: 12 JPEGs 500x375" in printed and "efficientnet_lite0 64 px, batch 4, 2 batches timed" in printed
    for line in LINES:
        assert float(re.search(rf"^  {re.escape(line)} +(\S+) images/s$", printed, re.MULTILINE)[1]) > 0, printed
    for ratio in RATIOS:
        assert float(re.search(rf"^  {re.escape(ratio)} +(\S+)x$", printed, re.MULTILINE)[1]) > 0, printed


def test_photos_past_the_unique_ones_are_links_to_them(tmp_path):
    from scripts.bench.birds import make_jpegs

    files = make_jpegs(tmp_path, 5, unique=2)
    assert len(files) == 10 and len({path.stat().st_ino for path in files}) == 4  # 2 unique per class
    assert files[4].samefile(files[0]) and files[3].samefile(files[1]) and not files[1].samefile(files[0])


@pytest.mark.slow  # over 7 s of a worker: make test-fast stays under 2 minutes
def test_too_few_photos_for_the_batches_is_refused():
    result = run_module("scripts.bench.birds", "--batches", "4", "--batch-size", "8", "--images", "8")
    assert result.returncode == 1
    assert result.stderr == "error: --images 8 per class is too few for --batches 4 of 8\n"
