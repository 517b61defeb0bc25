"""Evaluation of CLIP-style models on what PanelForge releases: zero-shot classification, closed VQA
as classification, image-text retrieval on an article-disjoint held-out split, with bootstrap
intervals and a comparison against a baseline checkpoint."""
