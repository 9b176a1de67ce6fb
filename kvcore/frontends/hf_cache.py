"""Models where people keep them: a ``config.json`` in the local Hugging Face hub cache.

``--model org/name`` finds a model's config in the cache ``huggingface_hub`` downloads into,
after the bundled zoo and without touching the network. The cache is, in order:

1. ``$HF_HUB_CACHE`` (or the older ``$HUGGINGFACE_HUB_CACHE``);
2. ``$HF_HOME/hub``;
3. ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.

A repository ``org/name`` lives in ``models--org--name/``; ``refs/main`` names the revision whose
files are in ``snapshots/<revision>/``. When ``refs/main`` is missing (a download by revision),
the one snapshot holding a ``config.json`` is used, or the most recently modified of several. A
revision asked for by name is ``refs/<branch or tag>``'s snapshot, or the snapshot of that commit.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache folder the environment names (it need not exist)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        value = os.environ.get(variable)
        if value:
            return Path(value).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def _repo_dir(cache: Path, name: str) -> Path | None:
    org, _, model = name.partition("/")
    folder = cache / f"models--{org}--{model}"
    if folder.is_dir():
        return folder
    wanted = folder.name.lower()
    try:
        matches = [entry for entry in cache.iterdir() if entry.name.lower() == wanted and entry.is_dir()]
    except OSError:
        return None
    return matches[0] if len(matches) == 1 else None


#: One part of a repository id as the Hub allows it (huggingface_hub's ``validate_repo_id``:
#: letters, digits, ``-``, ``_`` and ``.``, at most 96 characters, no ``--`` or ``..``).
_REPO_PART = re.compile(r"[A-Za-z0-9_.-]{1,96}")


def is_repo_id(name: str) -> bool:
    """Whether ``name`` reads as a Hub repository id ``org/model`` (two parts of the characters
    the Hub allows, neither ``.``, ``..``, holding ``--`` or ending in ``.json``, which is a
    config file's path mistyped): the only names looked up in the cache and on the Hub."""
    parts = name.strip().split("/")
    return (
        len(parts) == 2
        and all(_REPO_PART.fullmatch(part) and "--" not in part and ".." not in part for part in parts)
        and not name.strip().lower().endswith(".json")
    )


def _is_name(text: str) -> bool:
    return bool(text) and "/" not in text and "\\" not in text and text not in (".", "..")


def find_cached_config(name: str, cache: Path | None = None, *, revision: str | None = None) -> Path | None:
    """The cached ``config.json`` of repository ``name`` (``"org/model"``), or ``None``.

    Args:
        name: the repository id; anything but ``org/model`` is never in the cache.
        cache: the hub cache folder; default :func:`hub_cache_dir`.
        revision: a branch, tag or commit: the snapshot ``refs/<revision>`` names, or the
            snapshot of that commit; ``None`` for the default below.

    Returns:
        The path of the config in the snapshot ``refs/main`` names (else the only, or the most
        recently modified, snapshot holding one), or ``None`` when the cache does not hold it.
    """
    if not is_repo_id(name):
        return None
    parts = name.strip().split("/")
    root = cache if cache is not None else hub_cache_dir()
    if not root.is_dir():
        return None
    repo = _repo_dir(root, "/".join(parts))
    if repo is None:
        return None
    snapshots = repo / "snapshots"
    if revision is not None:
        if not _is_name(revision):
            return None
        ref = repo / "refs" / revision
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else revision
        config = snapshots / commit / "config.json"
        return config if _is_name(commit) and config.is_file() else None
    ref = repo / "refs" / "main"
    if ref.is_file():
        revision = ref.read_text(encoding="utf-8").strip()
        config = snapshots / revision / "config.json"
        if revision and config.is_file():
            return config
    try:
        found = [entry / "config.json" for entry in snapshots.iterdir() if (entry / "config.json").is_file()]
    except OSError:
        return None
    if not found:
        return None
    return max(found, key=lambda path: path.stat().st_mtime)
