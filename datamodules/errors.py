"""The one exception type for mistakes in a user's data: `scripts.train` prints it as one line."""


class DataError(Exception):
    """Bad input data (missing file, wrong columns, unreadable image...); the message names the culprit and the fix."""
