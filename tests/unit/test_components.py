"""The shared connected components (``pipelines/images/components.py``): labels numbered as
``scipy.ndimage.label`` numbers them, each component's box and pixel count."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage

from pipelines.images.components import components

# Read by hand:     x 0 1 2 3 4 5
MASK = """
                    . . . . # .
                    # # . . . .
                    . # . . . #
                    . . . . # .
                    . . . . . .
                    # . . . . .
"""


def _mask(text: str) -> np.ndarray:
    return np.array([[c == "#" for c in line.split()] for line in text.strip().splitlines()])


def test_components_through_corners_numbered_in_raster_order():
    labels, boxes, counts = components(_mask(MASK))
    # the lone pixel at (4, 0) comes first in raster order, before the pair starting at (0, 1),
    # though a scan of 2 x 2 blocks meets the pair first; (5, 2) and (4, 3) touch at a corner
    assert boxes.tolist() == [[4, 0, 5, 1], [0, 1, 2, 3], [4, 2, 6, 4], [0, 5, 1, 6]]
    assert counts.tolist() == [1, 3, 2, 1]
    assert labels[0, 4] == 1 and labels[1, 0] == labels[1, 1] == labels[2, 1] == 2
    assert labels[2, 5] == labels[3, 4] == 3 and labels[5, 0] == 4
    assert (labels == 0).sum() == 36 - 7


def test_components_through_sides_only():
    labels, boxes, counts = components(_mask(MASK), eight=False)
    # the corner-touching pair is two components now
    assert boxes.tolist() == [[4, 0, 5, 1], [0, 1, 2, 3], [5, 2, 6, 3], [4, 3, 5, 4], [0, 5, 1, 6]]
    assert counts.tolist() == [1, 3, 1, 1, 1]
    assert labels[2, 5] == 3 and labels[3, 4] == 4


@pytest.mark.parametrize("shape", [(0, 5), (4, 0), (3, 3)])
def test_no_ink_is_no_component(shape):
    labels, boxes, counts = components(np.zeros(shape, bool))
    assert labels.shape == shape and not labels.any()
    assert boxes.shape == (0, 4) and counts.shape == (0,)


def test_a_mask_must_be_two_dimensional():
    with pytest.raises(ValueError, match="2-D"):
        components(np.zeros((2, 2, 2), bool))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 40),
    st.floats(0.05, 0.7),
    st.integers(0, 2**31 - 1),
    st.booleans(),
)
def test_the_same_components_as_scipy(h, w, density, seed, eight):
    """Every rule that walks the components in order decides as it did on scipy's labels."""
    mask = np.random.default_rng(seed).random((h, w)) < density
    labels, boxes, counts = components(mask, eight=eight)
    expected, n = ndimage.label(mask, structure=np.ones((3, 3), bool) if eight else None)
    assert np.array_equal(labels, expected)
    slices = ndimage.find_objects(expected)
    assert boxes.tolist() == [[s[1].start, s[0].start, s[1].stop, s[0].stop] for s in slices]
    assert counts.tolist() == np.bincount(expected.ravel(), minlength=n + 1)[1:].tolist()
