"""Caption text, shared by every stage: normalising and splitting captions by panel label and the
figure's caption (``captions``), and assigning caption parts to panels (``pairing``)."""
