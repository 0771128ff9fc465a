"""PenguinDataModule: both CSV schemas, the course's preparation, an honest split, clear errors."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from datamodules.errors import DataError
from datamodules.penguins import PenguinDataModule, read_penguins
from datamodules.preprocessing.penguins import COURSE_SCALE, ISLANDS, SPECIES
from tests.conftest import SHARED_DATA

COURSE_CSV = SHARED_DATA / "penguins" / "penguins.csv"
needs_course_csv = pytest.mark.skipif(not COURSE_CSV.exists(), reason=f"needs the course's CSV at {COURSE_CSV}")


def setup(stage="fit", **kwargs) -> PenguinDataModule:
    data = PenguinDataModule(**kwargs)
    data.setup(stage)
    return data


def test_palmerpenguins_default_drops_incomplete_rows():
    table = read_penguins(None)
    assert len(table) == 342  # 344 penguins, 2 without measurements
    assert set(table["island"]) == {0, 1, 2}
    assert set(table["species"]) == {0, 1, 2}
    assert table.notna().all().all()


@needs_course_csv
def test_course_csv_gives_the_same_penguins_as_palmerpenguins():
    course, package = read_penguins(COURSE_CSV), read_penguins(None)
    assert len(course) == len(package) == 342
    pd.testing.assert_frame_equal(course.reset_index(drop=True), package.reset_index(drop=True), check_dtype=False)


def test_palmerpenguins_schema_csv(tmp_path):
    from palmerpenguins import load_penguins

    path = tmp_path / "penguins.csv"
    load_penguins().to_csv(path, index=False)
    data = setup(csv_path=str(path))
    assert sum(len(data.splits[s][0]) for s in ("train", "val", "test")) == 342


def test_course_scaling_matches_the_course_example():
    data = PenguinDataModule()
    measured = torch.tensor([[ISLANDS.index("Biscoe"), 50.4, 15.3, 200.0, 5000.0]])  # island, culmen, flipper, mass
    assert torch.allclose(data.features(measured), torch.tensor([[1.0, 50.4, 15.3, 20.0, 50.0]]))
    assert COURSE_SCALE.tolist() == [1, 1, 1, 10, 100]


def test_standardize_uses_training_statistics_only():
    data = setup(preprocessing="standardize")
    train_inputs = data.splits["train"][0]
    assert torch.allclose(train_inputs.mean(0), torch.zeros(5), atol=1e-5)
    assert torch.allclose(train_inputs.std(0), torch.ones(5), atol=1e-4)
    assert not torch.allclose(data.splits["test"][0].mean(0), torch.zeros(5), atol=1e-3)


def test_split_is_disjoint_complete_stratified_and_seeded():
    data = setup()
    train, val, test = (set(rows.tolist()) for rows in data.split_rows)
    assert not train & val and not train & test and not val & test
    assert len(train | val | test) == 342
    # Each row's own hash decides its split: 0.15 of the rows on average (51), not exactly.
    assert (len(train), len(val), len(test)) == (235, 45, 62)
    for split in ("train", "val", "test"):
        assert set(data.splits[split][1].tolist()) == {0, 1, 2}  # every species in every split
    again, other_seed = setup(), setup(seed=7)
    assert all(torch.equal(a, b) for a, b in zip(data.split_rows, again.split_rows))
    assert not torch.equal(data.split_rows[2], other_seed.split_rows[2])


def test_training_batches_are_slices_reshuffled_each_epoch():
    data = setup()
    loader = data.train_dataloader()
    first, second = [torch.cat([x for x, _ in loader]) for _ in range(2)]
    assert len(loader) == 12 and first.shape == (235, 5)
    assert not torch.equal(first, second)
    assert torch.equal(first.sort(0).values, second.sort(0).values)


def rows_of(loader) -> list[tuple[float, ...]]:
    return [tuple(row.tolist()) for x, *_ in loader for row in x]


def test_ranks_get_disjoint_training_shards_of_one_length_and_evaluation_shards_of_every_row_once():
    data = setup(seed=6)  # a split of 240 training rows, 57 validation rows
    for split, make in (("train", data.train_dataloader), ("val", data.val_dataloader)):
        shards = []
        for rank in (0, 1):
            loader = make()
            loader.rank, loader.world_size = rank, 2
            shards.append(rows_of(loader))
        every = [tuple(row.tolist()) for row in data.splits[split][0]]
        assert sorted(shards[0] + shards[1]) == sorted(every), split  # each row once, none repeated, none left out
        if split == "train":
            assert len(shards[0]) == len(shards[1]) == 120  # 240 rows: even, so no padding either
    assert (len(shards[0]), len(shards[1])) == (29, 28)  # 57 validation rows: not padded to 29 + 29


def test_an_odd_training_split_pads_the_shorter_shard_so_every_rank_takes_as_many_steps():
    from datamodules.base import InMemoryBatches

    rows = torch.arange(5.0).unsqueeze(1)
    shards = [[x[0].item() for (x,) in InMemoryBatches(rows, batch_size=1, rank=r, world_size=2)] for r in (0, 1)]
    assert shards == [[0.0, 2.0, 4.0], [1.0, 3.0, 0.0]]  # row 0 again: DistributedSampler's padding


def test_predict_reads_a_csv_without_species_and_names_each_row_it_skips(tmp_path, capsys):
    path = tmp_path / "new.csv"
    path.write_text(
        "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass\nBiscoe,50.4,15.3,200,5000\nDream,,1,2,\n"
        "Biscoe,50.4,15.3,200,5000\n"
    )
    data = setup("predict", predict_path=str(path))
    assert torch.allclose(data.splits["predict"][0], torch.tensor([[1.0, 50.4, 15.3, 20.0, 50.0]] * 2))
    assert data.predict_names == ["line 2", "line 4"]
    assert capsys.readouterr().err == f"{path}: line 3 has no CulmenLength, BodyMass: skipped, no answer for it\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("a,b\n1,2\n", "missing columns"),
        ("Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass,Species\nDream,x,1,2,3,0\n", "non-numeric"),
        ("Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass,Species\nDream,,1,2,3,0\n", "no row has all"),
        ("Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass,Species\nAtlantis,1,1,2,3,0\n", "unknown island"),
        ("Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass,Species\nDream,1,1,2,3,Emperor\n", "Emperor. is none"),
        (
            "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass,Species\n1,39.1,18.7,181,3750,0\n",
            "unknown island 1 in column Island on line 2; the model knows",
        ),  # not np.int64(1)
        (
            "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass,Species\nDream,1,1,2,3,0\n".encode("utf-16-le"),
            "UTF-16LE text .without a byte order mark., not UTF-8; save it as",
        ),  # not "missing columns"
        (
            "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass,Species\nDream,1,1,2,3,0\n".encode("utf-16-be"),
            "UTF-16BE text .without a byte order mark., not UTF-8",
        ),
    ],
)
def test_bad_csv_names_the_file_and_the_fix(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(DataError, match=message) as error:
        setup(csv_path=str(path))
    assert str(path) in str(error.value) and "\n" not in str(error.value)


HEADER = "Island,CulmenLength,CulmenDepth,FlipperLength,BodyMass,Species\n"
GOOD = "Dream,39.1,18.7,181,3750,0\n"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("Dream,inf,18.7,181,3750,0", "line 3, column CulmenLength: 'inf' is not a finite number"),
        ("Dream,39.1,nan,181,3750,0", "line 3, column CulmenDepth: 'nan' is not a finite number"),
        ("Dream,39.1,18.7,-Infinity,3750,0", "line 3, column FlipperLength: '-inf' is not a finite number"),
        ("Dream,39.1,18.7,181,NaN,0", "line 3, column BodyMass: 'NaN' is not a finite number"),
        ("Dream,39.1,18.7,181,3.75e9,0", r"line 3, column BodyMass: 3.75e\+09 is no penguin's \(1500 to 9000 g\)"),
        ("Dream,39.1,18.7,18.1,3750,0", r"line 3, column FlipperLength: 18.1 is no penguin's \(120 to 260 mm\)"),
    ],
)
def test_a_value_no_penguin_has_is_refused_by_file_line_and_column(tmp_path, row, message):
    """A non-finite value would train a network of NaN weights; an absurd one would widen the ranges predict
    accepts. Either is refused before training, named where it stands."""
    path = tmp_path / "typo.csv"
    path.write_text(HEADER + GOOD + row + "\n" + GOOD)
    with pytest.raises(DataError, match=message) as error:
        setup(csv_path=str(path))
    assert str(error.value).startswith(f"{path}: ") and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("rows", "line"),
    [
        ("Dream,39.1,18.7,181,3,750,0\n" * 2, 3),  # every row: pandas took each row's island as its index
        (GOOD + "Dream,39.1,18.7,181,3,750,0\n", 4),  # one row: pandas' parser error, on two lines
    ],
)
def test_a_row_of_more_values_than_the_header_is_refused_by_its_line(tmp_path, rows, line):
    """`3,750` for 3750 splits a cell in two: every value after it would shift a column, or pandas' error would end in
    a line of its own."""
    path = tmp_path / "thousands.csv"
    path.write_text(HEADER + GOOD + rows)
    with pytest.raises(DataError) as error:
        read_penguins(path)
    assert str(error.value) == (
        f"{path}: line {line} has 7 values, the header names 6 columns (Island, CulmenLength, CulmenDepth, "
        "FlipperLength, BodyMass, Species); remove the extra values (a thousands separator: 5000, not 5,000) or name "
        "their columns"
    )


def test_a_spreadsheets_trailing_commas_read_as_the_rows_they_end(tmp_path):
    """Empty fields past the header's, as spreadsheets write them, are no values: the rows read in their columns."""
    path = tmp_path / "exported.csv"
    path.write_text(HEADER + (GOOD.strip() + ",\n") * 2 + "Dream,39.1,,181,3750,0,,\n")
    table = read_penguins(path)
    assert list(table.index) == [0, 1]
    assert table.loc[1].tolist() == [ISLANDS.index("Dream"), 39.1, 18.7, 181, 3750, 0]


def test_a_csv_typed_with_a_space_after_each_comma_reads_as_without(tmp_path):
    """`Island, CulmenLength, ...` was refused as missing the columns it names."""
    plain, spaced = tmp_path / "plain.csv", tmp_path / "spaced.csv"
    plain.write_text(HEADER + GOOD + "Biscoe,50.4,15.3,200,5000,1\n")
    spaced.write_text(plain.read_text().replace(",", ", ").replace("Biscoe", " Biscoe "))
    pd.testing.assert_frame_equal(read_penguins(spaced), read_penguins(plain))
    predict = tmp_path / "new.csv"
    predict.write_text(
        "island , bill_length_mm, bill_depth_mm, flipper_length_mm, body_mass_g\nDream , 39.1, 18.7, 181, 3750\n"
    )
    row = read_penguins(predict, need_species=False).iloc[0].tolist()
    assert row == [ISLANDS.index("Dream"), 39.1, 18.7, 181, 3750]


def test_rows_are_named_by_their_line_in_the_file_blank_lines_counted(tmp_path, capsys):
    """pandas skipped blank lines and numbered the rows after them as if they were not there: predict answered the
    penguin of line 6 as "line 4", a blank line, and a refusal named a line above the culprit."""
    path = tmp_path / "new.csv"
    path.write_text(
        "\nIsland,CulmenLength,CulmenDepth,FlipperLength,BodyMass\nBiscoe,50.4,15.3,200,5000\n\n   \n"
        "Biscoe,50.4,15.3,200,5000\n,,,,\nDream,,1,2,\n"
    )
    data = setup("predict", predict_path=str(path))
    assert data.predict_names == ["line 3", "line 6"]
    assert capsys.readouterr().err == f"{path}: line 8 has no CulmenLength, BodyMass: skipped, no answer for it\n"
    path.write_text(HEADER + GOOD + "\n" + GOOD.replace("39.1", "abc"))
    with pytest.raises(DataError, match="column CulmenLength has a non-numeric value 'abc' on line 4;"):
        read_penguins(path)


def test_missing_cells_still_drop_their_row(tmp_path):
    """palmerpenguins' own NA and empty cells are missing measurements: the course drops those rows."""
    path = tmp_path / "gaps.csv"
    path.write_text(HEADER + GOOD + "Dream,NA,18.7,181,3750,0\nDream,39.1,,181,3750,0\n" + GOOD)
    assert list(read_penguins(path).index) == [0, 3]


def test_species_names_are_the_course_order():
    assert PenguinDataModule.class_names == list(SPECIES) == ["Adelie", "Gentoo", "Chinstrap"]
