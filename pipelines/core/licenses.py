"""License strings from PMC file lists and metadata, normalized to a code and a group.

PMC uses short codes ("CC BY", "CC BY-NC-SA", "CC0", "NO-CC CODE"); mirrors and the cloud
metadata also carry URLs or variants ("cc-by-4.0", "CC-BY 4.0"). Groups follow PMC's
commercial / noncommercial / other split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COMMERCIAL = ("CC0", "CC BY", "CC BY-SA", "CC BY-ND")
NONCOMMERCIAL = ("CC BY-NC", "CC BY-NC-SA", "CC BY-NC-ND")
OTHER = ("NO-CC CODE",)

_URL = re.compile(r"creativecommons\.org/(?:licenses/(?P<kind>[a-z-]+)|publicdomain/(?P<pd>zero|mark))", re.I)
_CODE = re.compile(
    r"^(?:CC[\s_-]*(?P<parts>BY(?:[\s_-]*(?:NC|SA|ND))*)|CC[\s_-]*0|CC[\s_-]*ZERO)(?:[\s_-]*\d(?:\.\d)?)?$", re.I
)


@dataclass(frozen=True)
class License:
    code: str | None
    group: str
    warning: str | None = None


def _code_from_parts(parts: str) -> str:
    tokens = [t.upper() for t in re.split(r"[\s_-]+", parts) if t]
    order = [t for t in ("NC", "SA", "ND") if t in tokens[1:]]
    return "CC BY" + ("-" + "-".join(order) if order else "")


def normalize_license(raw: str | None) -> License:
    """Return the code and group of a license string; unknown strings are group "other" with a warning."""
    text = (raw or "").strip()
    if not text:
        return License(None, "other", "no license string")
    if text.upper().replace("_", "-") in ("NO-CC CODE", "NO-CC-CODE", "NONE"):
        return License("NO-CC CODE", "other")
    if text.upper() in ("PDM", "PUBLIC DOMAIN"):
        return License("PDM", "other")
    url = _URL.search(text)
    if url:
        if url.group("pd") == "zero":
            return License("CC0", "commercial")
        if url.group("pd") == "mark":
            return License("PDM", "other")
        code = _code_from_parts(url.group("kind").replace("by", "BY", 1))
    else:
        match = _CODE.match(text)
        if not match:
            return License(None, "other", f"unknown license string {text!r}")
        code = "CC0" if not match.group("parts") else _code_from_parts(match.group("parts"))
    if code in COMMERCIAL:
        return License(code, "commercial")
    if code in NONCOMMERCIAL:
        return License(code, "noncommercial")
    return License(code, "other", f"unusual license combination {text!r}")
