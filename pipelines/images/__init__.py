"""Figure images, shared by every stage: one decoder with one size rule and one reason vocabulary
(``decode.open_figure``), one JPEG encoder (``jpeg``), boxes and IoU (``boxes``), the crop gate,
image facts and near-duplicates (``info``, ``duplicates``), chart PNGs (``plots``), prepared
batches into normalised model inputs on the model's device (``tensors``)."""
