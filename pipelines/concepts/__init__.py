"""Concept labeling: figure embeddings (DINOv2 on Ray), concept model, annotation and propagation."""
