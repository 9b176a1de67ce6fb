"""The command-line fixtures of ``tests/cli`` (``run_cli``, ``spec_file``), for ``kvcore plan --pp``."""

from tests.cli.conftest import run_cli, spec_file  # noqa: F401 (fixtures)
