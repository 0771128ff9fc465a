"""Images decode as an upright 8-bit picture would: 16-bit PNGs scaled to 8 bits (not divided as if 8-bit), 32-bit
and floating-point TIFFs on the scale that holds their values (or refused by name), JPEGs turned by their EXIF
orientation (phone photos are stored sideways), and folders that mix them batch together."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules.errors import DataError
from datamodules.folder_files import read_image
from datamodules.image_folder import ImageFolderDataModule
from datamodules.preprocessing import images as preprocessing
from datamodules.preprocessing.images import read


def picture(height: int = 40, width: int = 56) -> np.ndarray:
    """A smooth, asymmetric picture (JPEG keeps it well; rotation is visible)."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1).astype(np.uint8)


def test_a_16_bit_png_decodes_as_its_8_bit_version(tmp_path: Path):
    rgb8 = picture()
    Image.fromarray(rgb8).save(tmp_path / "rgb8.png")
    grey16 = rgb8[..., 0].astype(np.uint16) * 257  # 255 -> 65535: the same picture with 16 bits a sample
    Image.fromarray(grey16).save(tmp_path / "grey16.png")
    Image.fromarray(rgb8[..., 0]).save(tmp_path / "grey8.png")
    assert read_image(tmp_path / "grey16.png").dtype == torch.uint8
    assert torch.equal(read_image(tmp_path / "grey16.png"), read_image(tmp_path / "grey8.png"))
    assert torch.equal(read_image(tmp_path / "grey16.png", grey=True), read_image(tmp_path / "grey8.png", grey=True))


def test_32_bit_and_floating_point_grey_images_decode_on_the_scale_that_holds_their_values(tmp_path: Path):
    """A floating-point TIFF of 0 to 1 decoded black (Pillow's convert takes floats as 0 to 255, and rounds 0.7 to 0);
    a 32-bit integer TIFF of 0 to 255 did too (read as 16 bits). Each now decodes as its 8-bit version, in training's
    and predict's read_image and in the registered model's preprocessing alike."""
    grey8 = picture()[..., 0]
    Image.fromarray(grey8).save(tmp_path / "grey8.png")
    wide = {
        "float-0-1.tif": Image.fromarray(grey8.astype(np.float32) / 255, "F"),
        "float-0-1.pfm": Image.fromarray(grey8.astype(np.float32) / 255, "F"),
        "float-0-255.tif": Image.fromarray(grey8.astype(np.float32), "F"),
        "int32-0-255.tif": Image.fromarray(grey8.astype(np.int32), "I"),
        "int32-0-65535.tif": Image.fromarray(grey8.astype(np.int32) * 257, "I"),
        "uint16-big-endian.tif": Image.fromarray((grey8.astype(np.uint16) * 257).astype(">u2")),
    }
    state, expected = {"image_size": 32}, (tmp_path / "grey8.png").read_bytes()
    for name, image in wide.items():
        image.save(tmp_path / name)
        with Image.open(tmp_path / name) as saved:
            assert saved.mode == image.mode, name  # the file holds the wide pixels
        for grey in (False, True):
            assert torch.equal(read_image(tmp_path / name, grey=grey), read_image(tmp_path / "grey8.png", grey=grey))
        served = preprocessing.photo_batch(state, [(tmp_path / name).read_bytes()], [name])
        assert np.array_equal(served, preprocessing.photo_batch(state, [expected], ["grey8.png"])), name


def test_a_wide_grey_image_of_no_known_scale_is_one_line_naming_it(tmp_path: Path):
    ramp = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    Image.fromarray(ramp, "F").save(tmp_path / "signed.tif")
    Image.fromarray(np.where(ramp > 0, np.nan, ramp).astype(np.float32), "F").save(tmp_path / "nan.tif")
    Image.fromarray((ramp * 100_000).astype(np.int32), "I").save(tmp_path / "int32.tif")
    with pytest.raises(DataError) as error:
        read_image(tmp_path / "signed.tif")
    assert str(error.value) == (
        f"{tmp_path / 'signed.tif'}: not a readable image (floating-point pixels from -1 to 1, in neither 0-1 nor "
        "0-255, so how bright each is cannot be told: save it as an 8-bit PNG); remove or replace it"
    )
    with pytest.raises(DataError) as error:
        read((tmp_path / "int32.tif").read_bytes(), "image 1")
    assert str(error.value) == (
        "image 1: not a readable image (32-bit integer pixels from -100000 to 100000, in neither 0-255 nor 0-65535, "
        "so how bright each is cannot be told: save it as an 8-bit PNG); send a JPEG, PNG or WebP file"
    )
    with pytest.raises(DataError, match=r"nan.tif: not a readable image \(floating-point pixels that are not numbers"):
        read_image(tmp_path / "nan.tif", grey=True)


def test_a_jpeg_with_an_exif_orientation_decodes_upright(tmp_path: Path):
    upright = picture()
    Image.fromarray(upright).save(tmp_path / "upright.jpg", quality=95)
    stored = Image.fromarray(np.rot90(upright, k=-1).copy())  # how a phone stores a portrait photo...
    exif = Image.Exif()
    exif[0x0112] = 8  # ...with "rotate 90 degrees counter-clockwise to view"
    stored.save(tmp_path / "phone.jpg", quality=95, exif=exif)
    decoded, expected = read_image(tmp_path / "phone.jpg"), read_image(tmp_path / "upright.jpg")
    assert decoded.shape == expected.shape == (3, 40, 56)
    assert (decoded.int() - expected.int()).abs().float().mean() < 3  # JPEG's own loss, not a turned picture


def test_a_folder_mixing_8_and_16_bit_images_batches(tmp_path: Path):
    for split in ("train", "val"):
        for name, channel in (("chickens", 0), ("turkeys", 1)):
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            for i in range(2):
                step = 1 if split == "train" else -1  # val: turned round, no copies of training pictures
                image = picture()[::step, ::step, channel]
                Image.fromarray(image).save(folder / f"{i}-8.png")
                Image.fromarray(image.astype(np.uint16) * 257).save(folder / f"{i}-16.png")
    # 7 of the 8: a batch of all 8 would be one step an epoch, which the datamodule makes four smaller ones
    data = ImageFolderDataModule(str(tmp_path), batch_size=7, image_size=32, num_workers=0)
    data.setup("fit")
    images, labels = next(iter(data.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (7, 3, 32, 32) and labels.shape == (7,)


def test_a_transparent_image_decodes_as_laid_on_white(tmp_path: Path):
    """A digit drawn in black on a web canvas is exported with its background transparent *black* (0, 0, 0, 0):
    dropping the alpha made the whole image black, the digit gone, and the network answered a blank. Laid on white, as
    a page shows it, it decodes as the same digit drawn on white, whatever colour its invisible pixels store."""
    canvas = np.zeros((28, 28, 4), np.uint8)  # transparent black
    canvas[6:22, 12:16] = (0, 0, 0, 255)  # a "1" in opaque black
    drawn = np.full((28, 28), 255, np.uint8)
    drawn[6:22, 12:16] = 0
    Image.fromarray(drawn).save(tmp_path / "on-white.png")
    rgba = Image.fromarray(canvas, "RGBA")
    rgba.save(tmp_path / "canvas.png")
    rgba.convert("LA").save(tmp_path / "grey-alpha.png")
    rgba.convert("P").save(tmp_path / "palette.png")  # a palette with a transparent index (Pillow keeps it: tRNS)
    rgba.save(tmp_path / "palette.gif")
    grey16 = np.where(drawn == 0, 0, 1000).astype(np.uint16)  # 16 bits a pixel: its transparent colour too
    Image.fromarray(grey16).save(tmp_path / "grey16.png", transparency=1000)
    for name in ("canvas.png", "grey-alpha.png", "palette.png", "palette.gif", "grey16.png"):
        for grey in (False, True):
            expected = read_image(tmp_path / "on-white.png", grey=grey)
            assert torch.equal(read_image(tmp_path / name, grey=grey), expected), (name, grey)


def test_a_heic_photo_is_named_as_one_in_training_and_serving(tmp_path: Path):
    """An iPhone's photo (.heic, HEIF): Pillow reads none, and the line says what it is and what to save it as."""
    heic = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(64)  # a HEIF file's first box, then data
    (tmp_path / "IMG_0001.heic").write_bytes(heic)
    why = "a HEIC photo (an iPhone camera's format), which is not read here: save it as JPEG"
    with pytest.raises(DataError) as error:
        read_image(tmp_path / "IMG_0001.heic")
    assert str(error.value) == f"{tmp_path / 'IMG_0001.heic'}: not a readable image ({why}); remove or replace it"
    with pytest.raises(DataError) as error:
        read(heic, "image 1")
    assert str(error.value).startswith(f"image 1: not a readable image ({why}); ")
    with pytest.raises(DataError, match=r"not a readable image \(not a JPEG, PNG, WebP or GIF image\)"):
        read(b"GIF87 is no GIF" + bytes(64), "image 2")  # other bytes keep the general reason
