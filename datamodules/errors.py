"""The one exception type for mistakes in a user's data (and its kind about one image): `scripts.train` prints it as
one line."""

from __future__ import annotations


class DataError(Exception):
    """Bad input data (missing file, wrong columns, unreadable image...); the message names the culprit and the fix."""


class ImageError(DataError):
    """A DataError about one image: "<name>: <reason>". Code that holds only its pixels (a crop) calls it "an image",
    and the code that read the file says "<path>: <reason>" instead."""

    def __init__(self, reason: str, name: str = "an image") -> None:
        super().__init__(f"{name}: {reason}")
        self.reason, self.name = reason, name

    def __reduce__(self) -> tuple:  # pickled (a process pool's result), it keeps its two parts
        return type(self), (self.reason, self.name)
