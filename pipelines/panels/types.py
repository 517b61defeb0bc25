"""What every panel module shares: a panel, a caption split, and the methods that find panels."""

from __future__ import annotations

from dataclasses import dataclass, field

Box = tuple[int, int, int, int]  # x1, y1, x2, y2 in original pixels; x2 and y2 exclusive

# xycut: the layout splitter alone (layout.split_panels); decision: the figure-level decision
# (split.panels_for_figure: layout, printed labels, caption, chart structure); detr: the detector;
# consensus: the detector and the weight-free method agreeing
XYCUT, DECISION, DETR, CONSENSUS = "xycut", "decision", "detr", "consensus"
METHODS = (XYCUT, DECISION, DETR, CONSENSUS)


@dataclass(frozen=True)
class Panel:
    """One panel of a figure. ``label`` is the printed panel label when known ("A", "b", "2",
    "ii", without brackets or punctuation), else None."""

    box: Box
    score: float = 1.0
    label: str | None = None

    @property
    def width(self) -> int:
        return self.box[2] - self.box[0]

    @property
    def height(self) -> int:
        return self.box[3] - self.box[1]

    @property
    def area(self) -> int:
        return max(0, self.width) * max(0, self.height)


@dataclass
class CaptionSplit:
    """A caption split by panel label. ``panels`` maps each label as printed (without brackets
    or punctuation) to its text, excluding the ``preface`` (the text before the first label,
    shared by every panel). Sub-panels are keyed beside their panel, after it ("a", "a1", "a2",
    "b"), the panel's text covering theirs; ``parents`` maps each sub-label to its panel's label.
    Every text is a substring of the normalised caption."""

    preface: str = ""
    panels: dict[str, str] = field(default_factory=dict)
    # upper, lower, digit, roman, alnum (A1, A2, B1), fignum (1A, 1B, 2A), position (Left, Right), none
    scheme: str = "none"
    confidence: float = 0.0
    parents: dict[str, str] = field(default_factory=dict)
