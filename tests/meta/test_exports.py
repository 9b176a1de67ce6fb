"""The public façade: what `kvcore` exports, and that importing it stays cheap."""

import subprocess
import sys

import kvcore


def test_all_lists_every_public_name_and_each_resolves():
    public = {name for name in dir(kvcore) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(kvcore, name)).__name__ == "module"}
    assert set(kvcore.__all__) == public - modules
    for name in kvcore.__all__:
        assert getattr(kvcore, name) is not None


def test_import_kvcore_does_not_import_torch():
    # pytest imports kvcore at start-up wherever it is installed (the pytest11 plugin), so the
    # package itself must not pull in torch until a name that needs it is used.
    code = (
        "import sys, kvcore, kvcore.testing.pytest_plugin; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "kvcore.allocate; assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_attribute():
    try:
        kvcore.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
