"""Where models run: weights resolved offline-first (``weights``), the Ray Data actor pool every
batch-inference stage runs through and its outage test (``ray_pool``), OpenCLIP's Hugging Face
text towers (``hf_text``)."""
