"""tests/integrations/sglang runs against the real SGLang (``kvcore[sglang]``, in its own environment; see
docs/how-to/serve-with-sglang.md for the install). Without SGLang the modules here are not
collected and ``test_sglang_is_installed`` skips, unless ``KVCORE_REQUIRE_SGLANG=1`` (CI's SGLang
run), where it fails instead.

torchvision: ``sglang.srt.configs`` imports ``torchvision.transforms`` for the image
preprocessing of its vision-language configs (``sglang/srt/multimodal/internvl_utils.py``), and
every module kvcore uses imports ``sglang.srt.configs``. PyPI's Linux torchvision wheels are
linked against CUDA torch (``libtorch_cuda.so``), which kvcore's CPU torch 2.13 does not have.
So where torchvision is not importable, transformers' image modules are imported first (they
then take their no-torchvision branch) and a stand-in module answers the two names SGLang's
configs read at import time; nothing here preprocesses an image, and anything else read from
the stand-in raises.
"""

from __future__ import annotations

import enum
import importlib.machinery
import importlib.util
import sys
import types

HAS_SGLANG = importlib.util.find_spec("sglang") is not None


def _torchvision_importable() -> bool:
    try:
        import torchvision  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        sys.modules.pop("torchvision", None)
        return False
    return True


def _stand_in_torchvision() -> None:
    import transformers.image_processing_utils
    import transformers.image_utils
    import transformers.video_processing_utils  # noqa: F401

    class InterpolationMode(enum.Enum):
        NEAREST = "nearest"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"

    def missing(module: str):  # type: ignore[no-untyped-def]
        def __getattr__(name: str) -> object:
            raise AttributeError(
                f"{module}.{name}: torchvision is not installed in kvcore's SGLang test environment"
            )

        return __getattr__

    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(
            name, None, is_package=not name.endswith("functional")
        )
        module.__path__ = []  # type: ignore[attr-defined]
        module.__getattr__ = missing(name)  # type: ignore[method-assign]
        sys.modules[name] = module
    sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]  # type: ignore[attr-defined]
    sys.modules["torchvision.transforms"].functional = sys.modules["torchvision.transforms.functional"]  # type: ignore[attr-defined]
    sys.modules["torchvision.transforms"].InterpolationMode = InterpolationMode  # type: ignore[attr-defined]
    sys.modules["torchvision.transforms.functional"].InterpolationMode = InterpolationMode  # type: ignore[attr-defined]


if HAS_SGLANG and not _torchvision_importable():
    _stand_in_torchvision()

collect_ignore_glob = [] if HAS_SGLANG else ["test_against_sglang.py", "test_scheduler_profile.py"]
