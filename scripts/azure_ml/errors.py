"""The one error of the Azure ML commands' checks, a module of its own so that every module below the commands can
raise it without importing the job code."""


class SubmitError(Exception):
    """A bad config path, option or workspace; the message names it and what to give instead."""
