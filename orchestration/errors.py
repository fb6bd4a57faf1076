"""User-facing errors of the CLI and runner: printed as one line (or one JSON object), exit 1."""


class CliError(Exception):
    pass


class JobFailed(CliError):
    """A Dagster run failed; the message names the step and the cause."""
