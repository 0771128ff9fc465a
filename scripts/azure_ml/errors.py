"""The one error of the Azure ML commands' checks, a module of its own so that every module below the commands can
raise it without importing the job code; and the sweeps extra, which `--sweep` (a sweep job, a pipeline's sweep step)
loads, as that error where this checkout dropped it."""


class SubmitError(Exception):
    """A bad config path, option or workspace; the message names it and what to give instead."""


def service_line(error: Exception) -> str:
    """The first line of what Azure ML answered (an azure-core HttpResponseError's message, else the error's text)."""
    lines = str(getattr(error, "message", None) or error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def sweeps_for_azure(option: str = "--sweep"):
    """scripts/sweeps/azure.py: a sweep file as an Azure ML sweep job (the sweeps extra's)."""
    from scripts.training.extras import ExtraMissing, load

    try:
        return load("scripts.sweeps.azure", "sweeps", option)
    except ExtraMissing as error:
        raise SubmitError(str(error)) from None
