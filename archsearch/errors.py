"""Errors a user can cause. The CLI prints them as one line (no traceback) and exits 2."""


class UserError(Exception):
    """Bad input: a malformed space or spec, an impossible constraint, a missing file, a bad URL.

    The message must name the field or the cause, e.g. ``model.pattern.every: must be >= 1, got 0``.
    """
