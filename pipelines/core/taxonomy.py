"""The concept taxonomy (panel types, global concepts and their local concepts): what annotators
choose from, what the release checks labels against and what the mining gate reads.

``taxonomy.json`` beside this module is the shipped one; ``PANELFORGE_TAXONOMY`` names a JSON file
that extends it (``load_taxonomy(extra)``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

TAXONOMY_FILE = Path(__file__).with_name("taxonomy.json")


def normalize_label(label: str) -> str:
    return re.sub(r"[\s\-\u2010-\u2015]+", "", label.strip().lower())


@dataclass
class Taxonomy:
    panel_types: list[str]
    local_concepts: dict[str, list[str]]

    @property
    def global_concepts(self) -> list[str]:
        return list(self.local_concepts)

    def local_index(self) -> dict[str, str]:
        """normalised local label -> its display form."""
        return {normalize_label(local): local for locals_ in self.local_concepts.values() for local in locals_}


def load_taxonomy(extra: str | None = None) -> Taxonomy:
    """The shipped taxonomy, extended by the JSON file ``extra`` (``PANELFORGE_TAXONOMY``) when given."""
    data = json.loads(TAXONOMY_FILE.read_text())
    if extra:
        more = json.loads(Path(extra).read_text())
        data["panel_types"] = list(dict.fromkeys(data["panel_types"] + more.get("panel_types", [])))
        for concept, locals_ in more.get("local_concepts", {}).items():
            data["local_concepts"][concept] = list(dict.fromkeys(data["local_concepts"].get(concept, []) + locals_))
    return Taxonomy(data["panel_types"], data["local_concepts"])
