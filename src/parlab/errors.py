"""User-facing errors.

``UsageError`` (a ``ValueError``) is bad input: the CLI prints its message on
one line and exits with status 2. Its message names what is wrong and how to
fix it. Internal invariants use ``assert`` instead.
"""


class UsageError(ValueError):
    """Bad input from the user: one line, naming the problem and the fix."""
