"""The one error of the Azure ML commands' checks, a module of its own so that every module below the commands can
raise it without importing the job code."""


class SubmitError(Exception):
    """A bad config path, option or workspace; the message names it and what to give instead."""


def service_line(error: Exception) -> str:
    """The first line of what Azure ML answered (an azure-core HttpResponseError's message, else the error's text)."""
    lines = str(getattr(error, "message", None) or error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
