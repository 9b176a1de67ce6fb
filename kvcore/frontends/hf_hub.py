"""Models by name from the Hugging Face Hub: a ``config.json`` and the safetensors headers.

``--model org/name`` that is neither bundled nor in the local cache is read from the Hub through
``huggingface_hub`` (the ``kvcore[hub]`` extra), which brings what users of the Hub expect: its
cache (the config lands where :mod:`kvcore.frontends.hf_cache` finds it next time, so a second
run needs no network), ``HF_TOKEN`` (or a saved login) for gated and private repositories,
``HF_ENDPOINT`` for a mirror, and revisions (a branch, tag or commit). ``HF_HUB_OFFLINE`` (or
``TRANSFORMERS_OFFLINE``) keeps kvcore off the network.

What is read: ``config.json`` (downloaded into the cache), then, only where the weights are
needed (a budget from a GPU's memory), ``model.safetensors.index.json`` and the header of each
safetensors file, fetched with HTTP range requests (``huggingface_hub``'s
``parse_safetensors_file_metadata``: the first 100 kB, then the rest of a longer header) so that
the weights' bytes are read, not estimated. Nothing else: no repository code runs (there is no
``trust_remote_code``), no tensor data is fetched, and the token is never printed, logged or
written: messages name the environment variable, never its value.

The environment is read when a model is looked up, not when ``huggingface_hub`` is imported, so
that the endpoint, cache and offline mode are the ones in force for that lookup.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from kvcore.errors import (
    HubUnavailableError,
    InvalidInputError,
    KVCoreError,
    ModelAccessError,
    UnknownModelError,
)
from kvcore.frontends.hf_cache import hub_cache_dir
from kvcore.frontends.safetensors_header import INDEX_FILE, SINGLE_FILE, shard_names, summarize
from kvcore.model_weights import CheckpointWeights
from kvcore.optional_dependencies import require

#: The Hub huggingface_hub talks to when ``HF_ENDPOINT`` is not set.
DEFAULT_ENDPOINT = "https://huggingface.co"
#: Safetensors headers fetched at once (a large model has tens of shards).
HEADER_THREADS = 8
_TRUE = {"1", "on", "yes", "true"}


def hub_endpoint() -> str:
    """The Hub the environment names: ``$HF_ENDPOINT``, else :data:`DEFAULT_ENDPOINT`."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline_variable() -> str | None:
    """The variable that puts the Hub offline (``HF_HUB_OFFLINE``, or transformers'
    ``TRANSFORMERS_OFFLINE``), as huggingface_hub reads them; ``None`` when online."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().lower() in _TRUE:
            return variable
    return None


def hub_available() -> bool:
    """Whether the Hub may be asked: huggingface_hub is installed and no variable puts it offline."""
    import importlib.util

    return offline_variable() is None and importlib.util.find_spec("huggingface_hub") is not None


@attrs.frozen(kw_only=True)
class HubConfig:
    """Where the Hub served a model's ``config.json`` from (:func:`fetch_config`).

    Attributes:
        name: the repository id.
        path: where huggingface_hub cached it (``.../snapshots/<commit>/config.json``).
        commit: the commit it is from; the safetensors headers are read at the same commit.
        revision: the revision asked for (``None``: the default branch).
        endpoint: the Hub it came from.
    """

    name: str
    path: Path
    commit: str
    revision: str | None
    endpoint: str

    def describe(self) -> str:
        """Where it came from, for messages: ``'org/name (Hugging Face Hub https://huggingface.co,
        revision main, commit 0123456789ab)'``."""
        return (
            f"{self.name} (Hugging Face Hub {self.endpoint}, revision {self.revision or 'main'}, "
            f"commit {self.commit[:12]}; cached in {self.path.parent})"
        )


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _cause(exc: BaseException) -> BaseException | None:
    return exc.__cause__ or exc.__context__


def _failure(exc: BaseException) -> str:
    """What went wrong in a few words, without the request's headers (no token)."""
    status = _status(exc)
    if status is not None:
        return f"HTTP {status}"
    inner = _cause(exc)
    text = str(inner if inner is not None and not str(exc).strip() else exc).strip().splitlines()
    return f"{type(inner or exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def translate(exc: Exception, name: str, filename: str, revision: str | None, endpoint: str) -> KVCoreError:
    """The typed error for a failed Hub request of ``filename`` in ``name``.

    Raises nothing: returns the error to raise (the caller raises it ``from None``, so no
    traceback carries the request).
    """
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
    )

    at = _at(revision)
    found = _refused_error(exc, name, endpoint) or _missing_error(exc, name, filename, revision, endpoint)
    if found is not None:
        return found
    if type(exc).__name__ == "SafetensorsParsingError":
        return InvalidInputError(f"{name}: {filename} is not a safetensors file the Hub can parse: {exc}")
    if isinstance(exc, OfflineModeIsEnabled):
        return offline_error(name, revision)
    if isinstance(exc, LocalEntryNotFoundError):
        cause = _cause(exc)
        if isinstance(cause, HfHubHTTPError):
            return translate(cause, name, filename, revision, endpoint)
        if isinstance(cause, OfflineModeIsEnabled):
            return offline_error(name, revision)
        return unreachable_error(name, endpoint, _failure(cause or exc), filename, at)
    if isinstance(exc, EntryNotFoundError):  # after LocalEntryNotFoundError, one of its kind
        return UnknownModelError(
            f"{name} has no {filename} at {at} on the Hugging Face Hub ({endpoint}): not a transformers "
            "model repository? pass the path of a config.json"
        )
    if isinstance(exc, HfHubHTTPError):
        return HubUnavailableError(
            f"{name}: the Hugging Face Hub at {endpoint} answered {_failure(exc)} for {filename}; try again "
            "later, or pass the path of a config.json"
        )
    return HubUnavailableError(
        f"{name}: reading {filename} from the Hugging Face Hub at {endpoint} failed ({_failure(exc)}); "
        "check the network (or HF_ENDPOINT), or pass the path of a config.json"
    )


def _at(revision: str | None) -> str:
    """Where in a repository, for messages: ``'revision v1'`` or ``'its default branch'``."""
    return f"revision {revision}" if revision else "its default branch"


def unreachable_error(name: str, endpoint: str, failure: str, filename: str, at: str) -> HubUnavailableError:
    """The error for a Hub that cannot be reached (``failure`` says how) and a cache without
    ``filename`` of ``name`` at ``at`` (``'revision v1'``, ``'its default branch'``)."""
    return HubUnavailableError(
        f"{name}: cannot reach the Hugging Face Hub at {endpoint} ({failure}) and the Hugging Face cache "
        f"({hub_cache_dir()}) does not hold {filename} of it at {at}; check the network (or HF_ENDPOINT), "
        "or pass the path of a config.json"
    )


def unresolved_host(endpoint: str) -> str | None:
    """Why the host of ``endpoint`` has no address (``'huggingface.co does not resolve: Name or
    service not known'``), or ``None`` when it resolves.

    A name that does not resolve is no network (or a misspelt ``HF_ENDPOINT``), which
    huggingface_hub would retry five times over 23 s of backoff, logging each try: asked first,
    it turns that wait into one lookup.
    """
    parts = urllib.parse.urlsplit(endpoint)
    if not parts.hostname:
        return None  # not a URL kvcore can check; huggingface_hub says what is wrong with it
    try:
        socket.getaddrinfo(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        return f"{parts.hostname} does not resolve: {getattr(exc, 'strerror', None) or exc}"
    return None


def _refused_error(exc: Exception, name: str, endpoint: str) -> KVCoreError | None:
    """A gated repository (403) or a refused token (401), or ``None`` for any other failure."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    # a missing repository answers 401 without a token too: that one is told as missing
    http = isinstance(exc, HfHubHTTPError) and not isinstance(exc, RepositoryNotFoundError)
    if isinstance(exc, GatedRepoError) or (http and _status(exc) == 403):
        return ModelAccessError(
            f"{name} is gated on the Hugging Face Hub ({endpoint}: HTTP {_status(exc) or 403}): accept its "
            f"licence on {endpoint}/{name} and set HF_TOKEN to a token of that account "
            "(or run `hf auth login`)"
        )
    if http and _status(exc) == 401:
        return ModelAccessError(
            f"the Hugging Face Hub ({endpoint}) refused the token for {name} (HTTP 401): set HF_TOKEN to a "
            "valid token (or run `hf auth login`), or unset it for a public model"
        )
    return None


def _missing_error(
    exc: Exception, name: str, filename: str, revision: str | None, endpoint: str
) -> KVCoreError | None:
    """No such repository or revision, or ``None`` for any other failure."""
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(exc, RepositoryNotFoundError):
        status = _status(exc)
        private = (
            "; a private or gated repository answers so without a token: set HF_TOKEN to a token that "
            "may read it"
            if status == 401
            else ""
        )
        return UnknownModelError(
            f"{name}: no such model repository on the Hugging Face Hub ({endpoint}, HTTP {status or 404})"
            f"{private}; "
            "check the name (org/model, as on its page)"
        )
    if isinstance(exc, RevisionNotFoundError):
        return UnknownModelError(
            f"{name} has no revision {revision!r} on the Hugging Face Hub ({endpoint}); give a branch, "
            "tag or "
            f"commit of {endpoint}/{name}"
        )
    return None


def offline_error(name: str, revision: str | None) -> UnknownModelError:
    """The error for a model kvcore may not look for on the Hub (offline mode)."""
    variable = offline_variable() or "HF_HUB_OFFLINE"
    at = f" at revision {revision}" if revision else ""
    return UnknownModelError(
        f"{name} is neither bundled nor in the Hugging Face cache ({hub_cache_dir()}){at}, and {variable}="
        f"{os.environ.get(variable, '1')} keeps kvcore off the Hub: unset {variable} to read it from the "
        "Hub, "
        "download it into that cache (or set HF_HUB_CACHE / HF_HOME to the cache that holds it), or pass "
        "the path of a config.json"
    )


def _hub(name: str) -> Any:
    return require("huggingface_hub", f"reading {name} from the Hugging Face Hub")


def fetch_config(name: str, revision: str | None = None) -> HubConfig:
    """Download ``config.json`` of repository ``name`` into the Hugging Face cache (the caller
    reads it: :func:`kvcore.frontends.hf_config.find_model_config`).

    Args:
        name: the repository id, ``org/model``.
        revision: a branch, tag or commit; ``None`` for the default branch.

    Raises:
        UnknownModelError: offline mode, no such repository, revision or config.json.
        ModelAccessError: a gated or private repository refused the request (401 / 403).
        HubUnavailableError: the Hub could not be reached or failed.
        MissingDependencyError: huggingface_hub is not installed (``kvcore[hub]``).
    """
    if offline_variable() is not None:
        raise offline_error(name, revision)
    _hub(name)
    from huggingface_hub import hf_hub_download

    endpoint = hub_endpoint()
    unresolved = unresolved_host(endpoint)  # no network: the cache alone, without the client's retries
    try:
        path = Path(
            hf_hub_download(
                name,
                "config.json",
                revision=revision,
                cache_dir=hub_cache_dir(),
                endpoint=endpoint,
                local_files_only=unresolved is not None,
            )
        )
    except Exception as exc:  # huggingface_hub's errors, and its HTTP client's
        if unresolved is not None:
            raise unreachable_error(name, endpoint, unresolved, "config.json", _at(revision)) from None
        raise translate(exc, name, "config.json", revision, endpoint) from None
    return HubConfig(
        name=name,
        path=path,
        commit=path.parent.name,
        revision=revision,
        endpoint=endpoint,
    )


def fetch_weights(model: HubConfig) -> CheckpointWeights | None:
    """The weights of ``model``'s checkpoint at its commit, from the safetensors headers on the
    Hub (range requests; the index is downloaded into the cache); ``None`` when the repository
    has no safetensors checkpoint (``model.safetensors`` or its index).

    Raises:
        HubUnavailableError, ModelAccessError, UnknownModelError: a request failed.
        InvalidInputError: an index or header that is not what safetensors writes.
    """
    _hub(model.name)
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    commit, endpoint = model.commit, model.endpoint
    try:
        index_path = Path(
            hf_hub_download(
                model.name, INDEX_FILE, revision=commit, cache_dir=hub_cache_dir(), endpoint=endpoint
            )
        )
    except EntryNotFoundError as exc:
        if isinstance(exc, LocalEntryNotFoundError):
            raise translate(exc, model.name, INDEX_FILE, commit, endpoint) from None
        names = [SINGLE_FILE]
    except Exception as exc:
        raise translate(exc, model.name, INDEX_FILE, commit, endpoint) from None
    else:
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidInputError(f"{index_path}: cannot read the safetensors index: {exc}") from None
        names = shard_names(index, f"{model.name} {INDEX_FILE}")
    api = HfApi(endpoint=endpoint)

    def header(filename: str) -> tuple[str, dict[str, Any]]:
        meta = api.parse_safetensors_file_metadata(model.name, filename, revision=commit)
        tensors = {
            tensor: {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": list(info.data_offsets)}
            for tensor, info in meta.tensors.items()
        }
        return f"{model.name} {filename}", tensors

    try:
        with ThreadPoolExecutor(max_workers=min(HEADER_THREADS, len(names))) as pool:
            headers = list(pool.map(header, names))
    except EntryNotFoundError as exc:
        if names == [SINGLE_FILE] and not isinstance(exc, LocalEntryNotFoundError):
            return None  # neither an index nor a single file: no safetensors checkpoint
        raise translate(exc, model.name, "a safetensors file", commit, endpoint) from None
    except Exception as exc:
        raise translate(exc, model.name, "a safetensors header", commit, endpoint) from None
    return summarize(headers, f"the Hugging Face Hub {endpoint}, commit {commit[:12]}")
