"""Where a model's weights are on disk, found without the network, and the one-line error that
says which setting to change and how to fetch them.

A model setting names either a local folder (a ``save_pretrained`` directory, e.g. what
``hf download <id> --local-dir <folder>`` writes) or a Hugging Face hub id. A folder that
exists is used as it is and never makes a network call, offline mode or not; a path that does
not exist is an error naming the setting, never a hub lookup. A hub id is looked up in the
Hugging Face cache first; only when it is not there, and offline mode is off, is the hub asked.
Every failure is one line: the setting and its value, what is missing, the ``hf download``
command that fetches the weights, and "offline" when offline mode is on.
"""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
from huggingface_hub.errors import HFValidationError

from pipelines.core.errors import StageInputError

CONFIG = "config.json"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
DOWNLOAD_PATTERNS = ["*.json", "*.safetensors"]  # config, image processor, weights (and their shard index)
# the ImageNet pixel mean and std the vision backbones we load were trained with (DINOv2, DAB-DETR's ResNet)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class ModelUnavailableError(StageInputError):
    """The weights are neither in a local directory nor in the Hugging Face cache (or cannot be
    fetched); the message is one line that names the setting."""


def is_offline() -> bool:
    return huggingface_hub.constants.is_offline_mode()


def fetch_command(repo_id: str, local_dir: str, revision: str | None = None, files: tuple[str, ...] = ()) -> str:
    """The command that puts a hub repository's files (all, or ``files``) in ``local_dir``
    (huggingface-hub 1.x/2.x CLI)."""
    rev = f" --revision {revision}" if revision else ""
    names = "".join(f" {name}" for name in files)
    return f"hf download {repo_id}{names}{rev} --local-dir {local_dir}"


def looks_like_path(model: str) -> bool:
    """A value meant as a folder rather than a hub id: absolute, ``~``/``.``-relative, Windows
    style, or anything a hub id cannot be (more than one ``/``)."""
    return model.startswith(("/", "~", ".", "\\")) or (len(model) > 1 and model[1] == ":") or model.count("/") > 1


def has_weights(folder: Path) -> bool:
    return any((folder / name).is_file() for name in WEIGHT_FILES)


def cached_folder(repo_id: str, revision: str | None = None) -> Path | None:
    """The Hugging Face cache's snapshot folder of ``repo_id`` when its config.json is cached
    (no network), else None."""
    try:
        found = huggingface_hub.try_to_load_from_cache(repo_id, CONFIG, revision=revision)
    except (ValueError, HFValidationError):  # not a valid repo id
        return None
    return Path(found).parent if isinstance(found, str) else None


class Weights:
    """One model setting: ``setting`` (the environment variable a user sets) holds ``model`` (a
    folder or hub id, at ``revision``); ``default_id`` is the hub id to name in the fetch command
    when ``model`` is a folder; ``what`` says which model it is."""

    def __init__(self, setting: str, model: str, default_id: str, what: str, revision: str | None = None):
        self.setting, self.model, self.default_id, self.what, self.revision = setting, model, default_id, what, revision

    @property
    def is_folder(self) -> bool:
        return Path(self.model).expanduser().is_dir() or looks_like_path(self.model)

    def error(self, problem: str) -> ModelUnavailableError:
        """``<setting>=<value>: <problem>; fetch them with `hf download ...`[; offline ...]``, one line."""
        if self.is_folder:
            fix = f"fetch the weights into it with `{fetch_command(self.default_id, self.model)}`"
        else:
            fix = (
                f"fetch them with `{fetch_command(self.model, '<folder>', self.revision)}` "
                f"and set {self.setting}=<folder>"
            )
        offline = "; offline mode is on (HF_HUB_OFFLINE), so nothing is downloaded" if is_offline() else ""
        message = f"{self.setting}={self.model!r} ({self.what}): {problem}; {fix}{offline}"
        return ModelUnavailableError(" ".join(message.split()))

    def local(self) -> Path | None:
        """The folder holding the weights, without the network: the configured folder (checked to
        hold a config and weights), or the cache's snapshot of the hub id; None when the hub id is
        not cached. A folder setting that does not exist raises."""
        path = Path(self.model).expanduser()
        if path.is_dir():
            if not (path / CONFIG).is_file():
                raise self.error(f"the folder has no {CONFIG}")
            if not has_weights(path):
                raise self.error(f"the folder has no weights ({' or '.join(WEIGHT_FILES[::2])})")
            return path
        if self.is_folder:
            raise self.error("no such folder")
        cached = cached_folder(self.model, self.revision)
        if cached is not None and not has_weights(cached):
            raise self.error("the Hugging Face cache has its config but no weights")
        return cached

    def folder(self) -> Path:
        """:meth:`local`, else the hub's files downloaded into the cache (only when not offline)."""
        found = self.local()
        if found is not None:
            return found
        if is_offline():
            raise self.error("not in the Hugging Face cache")
        try:
            return Path(
                huggingface_hub.snapshot_download(self.model, revision=self.revision, allow_patterns=DOWNLOAD_PATTERNS)
            )
        except Exception as exc:  # noqa: BLE001 - hub, HTTP and connection errors all mean "cannot fetch"
            raise self.error(f"not in the Hugging Face cache and the download failed ({_first_line(exc)})") from exc

    def config_file(self) -> Path:
        """Its config.json: from :meth:`local`, else the hub's config.json alone (not the
        weights) when not offline. What a set-up check reads before any model is built."""
        found = self.local()
        if found is not None:
            return found / CONFIG
        if is_offline():
            raise self.error("not in the Hugging Face cache")
        try:
            return Path(huggingface_hub.hf_hub_download(self.model, CONFIG, revision=self.revision))
        except Exception as exc:  # noqa: BLE001
            raise self.error(
                f"not in the Hugging Face cache and its {CONFIG} cannot be fetched ({_first_line(exc)})"
            ) from exc


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return line if len(line) <= 160 else line[:157] + "..."


def from_pretrained_offline_first(cls, model: str, unavailable, revision: str | None = None):
    """``cls.from_pretrained(model)`` from a local directory or the Hugging Face cache first; the
    hub only when not offline. ``unavailable(exc)`` builds the error raised when neither has it.
    A folder that exists is loaded as it is, never from the network: what goes wrong there is
    that folder's error, not "unavailable"."""
    if Path(model).expanduser().is_dir():
        return cls.from_pretrained(str(Path(model).expanduser()), local_files_only=True)
    kwargs = {"revision": revision} if revision else {}
    try:
        return cls.from_pretrained(model, local_files_only=True, **kwargs)
    except OSError as exc:
        if huggingface_hub.constants.is_offline_mode():
            raise unavailable(exc) from exc
    try:
        return cls.from_pretrained(model, **kwargs)
    except OSError as exc:
        raise unavailable(exc) from exc
