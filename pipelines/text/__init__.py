"""Caption text, shared by every stage: normalising and splitting captions by panel label and the
figure's caption (``captions``), assigning caption parts to panels (``pairing``), and counting tokens
as the CLIP text encoder does (``clip_bpe``)."""
