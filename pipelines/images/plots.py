"""Charts as PNG bytes, for the statistics the release, the long captions and the evaluation write."""

from __future__ import annotations

import io


def figure_png(fig, plt) -> bytes:
    """A matplotlib figure as PNG bytes (laid out tight), the figure closed."""
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()
