"""The command-line fixture of ``tests/cli`` (``run_cli``), for the families' context lengths."""

from tests.cli.conftest import run_cli  # noqa: F401 (fixture)
