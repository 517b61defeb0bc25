"""Panels: compound figures split into their panels (a weight-free layout splitter and DAB-DETR),
captions split by panel label, synthetic compound figures to train the detector, evaluation."""
