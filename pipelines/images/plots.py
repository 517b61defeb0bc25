"""Charts as PNG bytes, for the statistics the release, the long captions and the evaluation write."""

from __future__ import annotations

import io


def figure_png(fig, plt, synthetic: str | None = None) -> bytes:
    """A matplotlib figure as PNG bytes (laid out tight), the figure closed; ``synthetic`` adds a
    red footer saying what in it is synthetic."""
    fig.tight_layout()
    if synthetic:
        fig.subplots_adjust(bottom=fig.subplotpars.bottom + 0.1)
        fig.text(0.01, 0.01, synthetic, color="#c0392b", fontsize=7, fontweight="bold", ha="left", va="bottom")
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()
