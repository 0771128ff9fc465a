"""The one error of the Azure ML commands' checks, a module of its own so that every module below the commands can
raise it without importing the job code; and the sweeps extra, which `--sweep` (a sweep job, a pipeline's sweep step)
loads, as that error where this checkout dropped it."""

import re


class SubmitError(Exception):
    """A bad config path, option or workspace; the message names it and what to give instead."""


def service_line(error: Exception) -> str:
    """The first line of what Azure ML answered (an azure-core HttpResponseError's message, else the error's text),
    without terminal colour codes."""
    lines = [line for line in without_ansi(str(getattr(error, "message", None) or error)).splitlines() if line.strip()]
    return lines[0].strip() if lines else type(error).__name__


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def without_ansi(text: str) -> str:
    """`text` without terminal colour codes: azure-ai-ml colours its validation reports, and one line of an error
    is no place for them."""
    return ANSI.sub("", text)


def sweeps_for_azure(option: str = "--sweep"):
    """scripts/sweeps/azure.py: a sweep file as an Azure ML sweep job (the sweeps extra's)."""
    from scripts.training.extras import ExtraMissing, load

    try:
        return load("scripts.sweeps.azure", "sweeps", option)
    except ExtraMissing as error:
        raise SubmitError(str(error)) from None
