"""The names of the panel methods: the values of ``panel_figures.method`` and ``panels.method``,
read by the panels stage, the release card and the synthetic-part notes."""

from __future__ import annotations

# xycut: the layout splitter alone (layout.split_panels); decision: the figure-level decision
# (split.panels_for_figure: layout, printed labels, caption, chart structure); detr: the detector;
# consensus: the detector and the weight-free method agreeing
XYCUT, DECISION, DETR, CONSENSUS = "xycut", "decision", "detr", "consensus"
METHODS = (XYCUT, DECISION, DETR, CONSENSUS)
