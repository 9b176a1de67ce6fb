"""The torch dtype of a :class:`~kvcore.dtypes.DType`, where the runtime makes tensors.

Specs and layouts name their dtypes (:mod:`kvcore.dtypes`) so that planning never imports
torch; allocation, binding and the reference kernels turn those names into ``torch.dtype``
objects here.
"""

from __future__ import annotations

import torch

from kvcore.dtypes import DTypeLike, to_dtype
from kvcore.errors import InvalidSpecError


def torch_dtype(dtype: DTypeLike) -> torch.dtype:
    """The ``torch.dtype`` of a cache dtype.

    Args:
        dtype: a :class:`~kvcore.dtypes.DType`, its name, or a ``torch.dtype``.

    Returns:
        ``torch.bfloat16`` for ``bfloat16``, and so on.

    Raises:
        InvalidSpecError: the dtype cannot hold a cache, or this torch build lacks it
            (the ``fnuz`` fp8 types are missing from old builds).
    """
    if isinstance(dtype, torch.dtype):
        to_dtype(dtype)  # the same checks as for a name
        return dtype
    name = to_dtype(dtype).name
    found = getattr(torch, name, None)
    if not isinstance(found, torch.dtype):
        raise InvalidSpecError(f"'dtype' {name!r} is not available in torch {torch.__version__}")
    return found
