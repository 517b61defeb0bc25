"""Upload a release folder to a Hugging Face dataset repository, after checking the Hub's limits.

The Hub documents its limits per repository: fewer than 10,000 entries per folder, fewer than
100,000 files per repository, and at most 50 GB per file (20 GB recommended). A folder that
breaks one is refused before any byte is sent, with the offending folder or file named.

Uploading is resumable: ``huggingface_hub`` < 2 does it with ``upload_large_folder``; from 2.0
that function is gone and ``upload_folder`` itself commits in parts and resumes when re-run
with the same arguments. PanelForge calls whichever the installed library has.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.errors import StageInputError

MAX_ENTRIES_PER_FOLDER = 10_000
MAX_FILES_PER_REPO = 100_000
MAX_FILE_BYTES = 50 * 10**9
RECOMMENDED_FILE_BYTES = 20 * 10**9


class HubLimitError(StageInputError, ValueError):
    """The folder cannot be uploaded as it is; the message says what to change."""


@dataclass
class UploadPlan:
    files: list[str]
    bytes: int
    warnings: list[str]


# Never published, whatever the allow patterns say: dotfiles and anything in a dot-folder, and
# temporary files (a killed writer's partial ``*.tmp``). Matched as huggingface_hub matches
# (``fnmatchcase``, ``*`` crosses ``/``), and passed to it as ``ignore_patterns``.
IGNORE_PATTERNS = [".*", "*/.*", "*.tmp", "*.tmp.*"]


def release_patterns(release: str) -> list[str]:
    return [f"{release}/**", "README.md", "LICENSES.md"]


def plan_upload(folder: Path, patterns: list[str]) -> UploadPlan:
    """The files that ``patterns`` select in ``folder`` (less ``IGNORE_PATTERNS``), checked
    against the Hub's limits."""
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    chosen = [
        f
        for f in files
        if any(fnmatch.fnmatchcase(f, pat) for pat in patterns)
        and not any(fnmatch.fnmatchcase(f, pat) for pat in IGNORE_PATTERNS)
    ]
    problems, warnings = [], []
    children: dict[str, set[str]] = {}
    for name in chosen:
        parts = name.split("/")
        for depth in range(len(parts)):
            parent = "/".join(parts[:depth]) or "."
            children.setdefault(parent, set()).add(parts[depth])
    for parent, kids in sorted(children.items()):
        if len(kids) > MAX_ENTRIES_PER_FOLDER:
            problems.append(f"folder {parent!r} has {len(kids):,} entries (the Hub allows {MAX_ENTRIES_PER_FOLDER:,})")
    if len(chosen) > MAX_FILES_PER_REPO:
        problems.append(f"{len(chosen):,} files (the Hub allows {MAX_FILES_PER_REPO:,} per repository)")
    total = 0
    for name in chosen:
        size = (folder / name).stat().st_size
        total += size
        if size > MAX_FILE_BYTES:
            problems.append(f"{name} is {size / 1e9:.1f} GB (the Hub allows {MAX_FILE_BYTES / 1e9:.0f} GB per file)")
        elif size > RECOMMENDED_FILE_BYTES:
            warnings.append(f"{name} is {size / 1e9:.1f} GB (the Hub recommends under 20 GB)")
    if problems:
        raise HubLimitError("release folder exceeds the Hub's limits: " + "; ".join(problems))
    return UploadPlan(chosen, total, warnings)


def upload_release(api, repo_id: str, folder: Path, release: str, private: bool = True) -> str:
    """Create the (private by default) dataset repository if needed and upload the release resumably."""
    api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    patterns = release_patterns(release)
    if hasattr(api, "upload_large_folder"):
        api.upload_large_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            repo_type="dataset",
            allow_patterns=patterns,
            ignore_patterns=IGNORE_PATTERNS,
            private=private,
        )
        return "upload_large_folder"
    api.upload_folder(
        repo_id=repo_id,
        folder_path=str(folder),
        repo_type="dataset",
        allow_patterns=patterns,
        ignore_patterns=IGNORE_PATTERNS,
        commit_message=f"PanelForge release {release}",
    )
    return "upload_folder"
