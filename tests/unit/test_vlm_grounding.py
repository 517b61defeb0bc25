"""Reading grounded boxes out of model answers: every wrapping an answer comes in, hand-written,
for each model family, with the original-pixel boxes worked out by hand in the comments; the
processor's resize against the values checked in transformers; and, as properties, that no text
makes the reader raise and that a cut-off answer never yields an item it did not contain."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.vlm.engine import QWEN2_5_VL, QWEN2_VL, QWEN3_VL, EngineConfig
from pipelines.vlm.grounding import GroundedBox, model_frame, parse_boxes, parse_json, smart_resize, to_original

# The image of every case: 400 wide, 300 high. Qwen2.5-VL (min_pixels 56*56) sees it as 392x308:
# x scales by 400/392 = 50/49 and y by 300/308 = 75/77. Qwen2-VL/Qwen3-VL answer on a 0-1000
# grid: x scales by 0.4 and y by 0.3.
SIZE = (400, 300)
FRAME_25 = (392, 308)
GRID_FAMILIES = [QWEN2_VL, QWEN3_VL]


def boxes_of(found: list[GroundedBox]) -> list[tuple[int, int, int, int]]:
    return [g.box for g in found]


# --- smart_resize ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hw, expected",
    [((300, 400), (308, 392)), ((3000, 4000), (840, 1148)), ((50, 60), (56, 56)), ((1024, 768), (1036, 756))],
)
def test_smart_resize_matches_the_values_run_in_transformers(hw, expected):
    assert smart_resize(*hw) == expected


def test_smart_resize_with_the_qwen3_factor_32():
    # library-facts: the tiny Qwen3-VL (min 32*32*4, max 32*32*256) gives grid [1,18,24] of 16-pixel
    # patches for 300x400: 288x384. By hand: round(300/32)=9 -> 288; round(400/32)=round(12.5)=12 -> 384.
    assert smart_resize(300, 400, factor=32, min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 256) == (288, 384)


def test_model_frame_uses_the_family_factor_and_the_pixel_band():
    # Default band 200704..1003520. 400x300 rounds to 392x308 = 120736 < 200704, so it is scaled up by
    # beta = sqrt(200704/120000) = 1.29326: Qwen2.5 (28): ceil(300*1.29326/28)=ceil(13.86)=14 -> 392,
    # ceil(400*1.29326/28)=ceil(18.48)=19 -> 532. Qwen3 (32): ceil(387.98/32)=13 -> 416, ceil(517.3/32)=17 -> 544.
    assert model_frame(400, 300, EngineConfig(family=QWEN2_5_VL)) == (532, 392)
    assert model_frame(400, 300, EngineConfig(family=QWEN3_VL)) == (544, 416)


# --- parse_json -----------------------------------------------------------------------------


def test_fenced_json_block():
    parsed = parse_json('```json\n{"panels": [{"label": "A", "bbox_2d": [1, 2, 3, 4]}]}\n```')
    assert parsed.value == {"panels": [{"label": "A", "bbox_2d": [1, 2, 3, 4]}]}
    assert parsed.error is None and not parsed.truncated


def test_fence_without_language_and_prose_around_it():
    text = 'The panels are:\n```\n[{"label": "B", "bbox_2d": [5, 6, 7, 8]}]\n```\nHope this helps!'
    assert parse_json(text).value == [{"label": "B", "bbox_2d": [5, 6, 7, 8]}]


def test_bare_json_and_json_inside_prose():
    assert parse_json(' {"description": "A western blot."}\n').value == {"description": "A western blot."}
    text = 'Sure! Here is the answer: {"regions": [{"bbox_2d": [1, 2, 3, 4]}]} Let me know if you need more.'
    assert parse_json(text).value == {"regions": [{"bbox_2d": [1, 2, 3, 4]}]}


def test_a_bracket_in_prose_before_the_json_is_skipped():
    text = 'Panels [A] and [B] are shown (see below): {"panels": [{"label": "A", "bbox_2d": [0, 0, 9, 9]}]}'
    assert parse_json(text).value == {"panels": [{"label": "A", "bbox_2d": [0, 0, 9, 9]}]}


def test_objects_one_after_another_become_a_list():
    text = '{"label": "A", "bbox_2d": [0, 0, 10, 10]}\n{"label": "B", "bbox_2d": [10, 0, 20, 10]},\n'
    assert parse_json(text).value == [
        {"label": "A", "bbox_2d": [0, 0, 10, 10]},
        {"label": "B", "bbox_2d": [10, 0, 20, 10]},
    ]


def test_truncated_answer_keeps_the_complete_items():
    text = '{"panels": [{"label": "A", "bbox_2d": [0, 0, 9, 9]}, {"label": "B", "bbox_2d": [9, 0, 1'
    parsed = parse_json(text)
    assert parsed.value == {"panels": [{"label": "A", "bbox_2d": [0, 0, 9, 9]}]}
    assert parsed.truncated and parsed.error is None


def test_truncated_inside_a_nested_list_drops_the_whole_outer_item():
    # B's own list "parts" has a complete first element, but B is incomplete: only A is kept.
    text = (
        '{"panels": [{"label": "A", "bbox_2d": [0, 0, 9, 9]}, '
        '{"label": "B", "bbox_2d": [9, 0, 18, 9], "parts": [{"x": 1}, {"x"'
    )
    assert parse_json(text).value == {"panels": [{"label": "A", "bbox_2d": [0, 0, 9, 9]}]}


def test_truncated_inside_a_string_and_inside_an_unclosed_fence():
    text = '```json\n[{"label": "A", "bbox_2d": [0, 0, 9, 9]}, {"label": "B}], [x'
    parsed = parse_json(text)
    assert parsed.value == [{"label": "A", "bbox_2d": [0, 0, 9, 9]}]
    assert parsed.truncated


def test_truncated_before_any_complete_item_is_not_a_fragment():
    # The bbox list is complete but its object is not: returning [1, 2, 3, 4] would be a box without
    # its label, so nothing is returned.
    parsed = parse_json('{"panels": [{"label": "A", "bbox_2d": [1, 2, 3, 4], "lab')
    assert parsed.value is None and parsed.truncated
    assert "cut off" in parsed.error


def test_trailing_commas_and_single_quotes_are_repaired():
    assert parse_json('{"panels": [{"label": "A", "bbox_2d": [1, 2, 3, 4],},],}').value == {
        "panels": [{"label": "A", "bbox_2d": [1, 2, 3, 4]}]
    }
    assert parse_json("{'label': 'A', 'bbox_2d': [1, 2, 3, 4]}").value == {"label": "A", "bbox_2d": [1, 2, 3, 4]}


def test_a_comma_before_a_bracket_inside_a_string_is_kept():
    assert parse_json('{"text": "see (a,]", "x": [1,],}').value == {"text": "see (a,]", "x": [1]}


@pytest.mark.parametrize(
    "text, error",
    [
        ("", "empty answer"),
        ("   \n", "empty answer"),
        ("I cannot find any panels in this image.", "no JSON in answer"),
        ("42", "no JSON in answer"),
        ('{"a": 1, oops {"c": 2}}', "no valid JSON in answer"),
        ("{x} [y]", "no valid JSON in answer"),
    ],
)
def test_garbage_gives_no_value_and_says_why(text, error):
    parsed = parse_json(text)
    assert parsed.value is None and parsed.error == error and not parsed.truncated


def test_not_a_string_is_an_error_not_a_crash():
    assert parse_json(None).error == "empty answer"  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_no_text_makes_parse_json_raise(text):
    parsed = parse_json(text)
    assert (parsed.value is None) == (parsed.error is not None)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="{}[]\",:'`\\ \n0123456789abjson-."))
def test_no_json_like_text_makes_parse_json_or_parse_boxes_raise(text):
    parse_json(text)
    for family in (QWEN2_5_VL, QWEN3_VL):
        found, _ = parse_boxes(text, family, SIZE, FRAME_25, list_key="panels")
        for g in found:
            x1, y1, x2, y2 = g.box
            assert 0 <= x1 < x2 <= SIZE[0] and 0 <= y1 < y2 <= SIZE[1]


_ITEMS = st.lists(
    st.fixed_dictionaries(
        {
            "label": st.one_of(st.none(), st.text(max_size=6)),
            "bbox_2d": st.lists(st.integers(0, 999), min_size=4, max_size=4),
        }
    ),
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(_ITEMS, st.booleans(), st.data())
def test_a_cut_off_answer_yields_only_items_it_contained_in_order(items, wrapped, data):
    doc = json.dumps({"panels": items} if wrapped else items, ensure_ascii=False)
    cut = data.draw(st.integers(1, len(doc)))
    parsed = parse_json(doc[:cut])
    if parsed.value is None:
        assert parsed.truncated
        return
    kept = parsed.value["panels"] if wrapped else parsed.value
    assert kept == items[: len(kept)]
    assert parsed.truncated == (cut < len(doc))


# --- to_original ----------------------------------------------------------------------------


def test_qwen25_maps_from_the_resized_frame():
    # [196, 154, 392, 308] in the 392x308 frame: 196*400/392 = 200, 154*300/308 = 150, 392 -> 400, 308 -> 300.
    assert to_original((196, 154, 392, 308), QWEN2_5_VL, SIZE, FRAME_25) == pytest.approx((200, 150, 400, 300))


@pytest.mark.parametrize("family", GRID_FAMILIES)
def test_grid_families_map_from_0_to_1000_whatever_the_frame(family):
    # [250, 500, 750, 1000]: 250*0.4 = 100, 500*0.3 = 150, 750*0.4 = 300, 1000*0.3 = 300.
    assert to_original((250, 500, 750, 1000), family, SIZE, FRAME_25) == pytest.approx((100, 150, 300, 300))
    assert to_original((250, 500, 750, 1000), family, SIZE, (544, 416)) == pytest.approx((100, 150, 300, 300))


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="family"):
        to_original((0, 0, 1, 1), "llava", SIZE, FRAME_25)


# --- parse_boxes, Qwen2.5-VL (resized-frame pixels) -----------------------------------------


def test_qwen25_fenced_panels():
    text = (
        '```json\n{"panels": [{"label": "A", "bbox_2d": [0, 0, 196, 154]}, '
        '{"label": "B", "bbox_2d": [196, 154, 392, 308], "confidence": "high"}]}\n```'
    )
    found, reason = parse_boxes(text, QWEN2_5_VL, SIZE, FRAME_25, list_key="panels")
    # A: 196 -> 200, 154 -> 150. B: the lower-right quarter, up to the image corner (400, 300).
    assert reason is None
    assert found == [
        GroundedBox((0, 0, 200, 150), (0.0, 0.0, 196.0, 154.0), "A", {}, False),
        GroundedBox((200, 150, 400, 300), (196.0, 154.0, 392.0, 308.0), "B", {"confidence": "high"}, False),
    ]


def test_qwen25_bare_list_instead_of_the_wrapper():
    # Asked for {"panels": [...]}, answered the list. 49*50/49 = 50, 77*75/77 = 75, 294 -> 300, 231 -> 225.
    found, reason = parse_boxes('[{"bbox_2d": [49, 77, 294, 231], "label": "C"}]', QWEN2_5_VL, SIZE, FRAME_25, "panels")
    assert reason is None and boxes_of(found) == [(50, 75, 300, 225)] and found[0].label == "C"


def test_qwen25_prose_around_json():
    text = 'Here are the panels I found:\n{"panels": [{"label": "a", "bbox_2d": [98, 0, 392, 154]}]}\nDone.'
    # 98*50/49 = 100, 0, 400, 150
    found, reason = parse_boxes(text, QWEN2_5_VL, SIZE, FRAME_25, "panels")
    assert reason is None and boxes_of(found) == [(100, 0, 400, 150)]


def test_qwen25_truncated_answer_keeps_complete_boxes_and_says_so():
    text = '{"panels": [{"label": "A", "bbox_2d": [0, 0, 196, 154]}, {"label": "B", "bbox_2d": [196, 15'
    found, reason = parse_boxes(text, QWEN2_5_VL, SIZE, FRAME_25, "panels")
    assert boxes_of(found) == [(0, 0, 200, 150)]
    assert "cut off" in reason


def test_qwen25_box_beyond_the_edge_is_clipped():
    # [-10, 154, 402, 320]: -10*50/49 = -10.2 -> -10 -> 0; 150; 402*50/49 = 410.2 -> 410 -> 400;
    # 320*75/77 = 311.7 -> 312 -> 300.
    found, reason = parse_boxes('{"bbox_2d": [-10, 154, 402, 320]}', QWEN2_5_VL, SIZE, FRAME_25, "regions")
    assert reason is None
    assert found == [GroundedBox((0, 150, 400, 300), (-10.0, 154.0, 402.0, 320.0), None, {}, True)]


def test_qwen25_swapped_corners_are_reordered():
    # [294, 231, 49, 77] is the box [49, 77, 294, 231] from its other corner: (50, 75, 300, 225).
    found, reason = parse_boxes({"regions": [{"bbox_2d": [294, 231, 49, 77]}]}, QWEN2_5_VL, SIZE, FRAME_25, "regions")
    assert reason is None
    assert boxes_of(found) == [(50, 75, 300, 225)]
    assert found[0].frame_box == (294.0, 231.0, 49.0, 77.0) and not found[0].clipped


def test_qwen25_drops_outside_empty_and_non_numeric_boxes_and_counts_them():
    answer = {
        "regions": [
            {"bbox_2d": [98, 77, 196, 154]},  # kept: (100, 75, 200, 150)
            {"bbox_2d": [400, 0, 500, 100]},  # x from 408 to 510, all beyond 400: outside
            {"bbox_2d": [98, 77, 98, 154]},  # zero width: empty
            {"bbox_2d": ["a", 1, 2, 3]},  # not numbers
            {"bbox_2d": [1, 2, 3]},  # three numbers
            {"bbox_2d": [True, 0, 5, 5]},  # a boolean is not a coordinate
            {"label": "D"},  # no box at all
        ]
    }
    found, reason = parse_boxes(answer, QWEN2_5_VL, SIZE, FRAME_25, "regions")
    assert boxes_of(found) == [(100, 75, 200, 150)]
    assert reason == "dropped 6 of 7 items (2 empty or outside the image, 1 no box, 3 not four numbers)"


def test_qwen25_garbage_and_empty_list():
    assert parse_boxes("No panels here.", QWEN2_5_VL, SIZE, FRAME_25, "panels") == ([], "no JSON in answer")
    assert parse_boxes('{"panels": []}', QWEN2_5_VL, SIZE, FRAME_25, "panels") == ([], None)
    assert parse_boxes("[]", QWEN2_5_VL, SIZE, FRAME_25, "panels") == ([], None)


def test_other_box_keys_and_bare_four_number_lists():
    # "bbox" instead of "bbox_2d"; a list of bare boxes; a single bare box; a custom key; a [[x1,y1],[x2,y2]] pair.
    assert boxes_of(parse_boxes('[{"bbox": [0, 0, 196, 154]}]', QWEN2_5_VL, SIZE, FRAME_25)[0]) == [(0, 0, 200, 150)]
    assert boxes_of(parse_boxes("[[0, 0, 196, 154], [196, 154, 392, 308]]", QWEN2_5_VL, SIZE, FRAME_25)[0]) == [
        (0, 0, 200, 150),
        (200, 150, 400, 300),
    ]
    assert boxes_of(parse_boxes("[196, 154, 392, 308]", QWEN2_5_VL, SIZE, FRAME_25)[0]) == [(200, 150, 400, 300)]
    found, _ = parse_boxes('[{"box": [0, 0, 196, 154], "bbox": 7}]', QWEN2_5_VL, SIZE, FRAME_25, box_key="box")
    assert boxes_of(found) == [(0, 0, 200, 150)] and found[0].fields == {"bbox": 7}
    assert boxes_of(parse_boxes('{"bbox_2d": [[0, 0], [196, 154]]}', QWEN2_5_VL, SIZE, FRAME_25)[0]) == [
        (0, 0, 200, 150)
    ]


def test_numeric_labels_become_strings_and_empty_labels_none():
    found, _ = parse_boxes(
        '[{"label": 2, "bbox_2d": [0, 0, 49, 77]}, {"label": "", "bbox_2d": [0, 0, 49, 77]}]',
        QWEN2_5_VL,
        SIZE,
        FRAME_25,
    )
    assert [g.label for g in found] == ["2", None]


def test_an_answer_without_the_list_says_what_it_has():
    found, reason = parse_boxes('{"panel_count": 3, "note": "x"}', QWEN2_5_VL, SIZE, FRAME_25, "panels")
    assert found == [] and "'panels'" in reason and "panel_count" in reason


def test_a_differently_named_single_list_is_read():
    found, reason = parse_boxes('{"regions": [{"bbox_2d": [0, 0, 49, 77]}]}', QWEN2_5_VL, SIZE, FRAME_25, "panels")
    assert reason is None and boxes_of(found) == [(0, 0, 50, 75)]


def test_an_empty_frame_is_a_reason_not_a_crash():
    assert parse_boxes("[[0, 0, 1, 1]]", QWEN2_5_VL, SIZE, (0, 0))[0] == []


def test_the_same_answer_differs_between_families_on_a_non_square_image():
    # The silent bug this module exists for: [196, 154, 392, 308] is the lower-right quarter for Qwen2.5-VL
    # but, on the 0-1000 grid, 196*0.4 = 78.4 -> 78, 154*0.3 = 46.2 -> 46, 392*0.4 = 156.8 -> 157, 308*0.3 = 92.4 -> 92.
    text = "[196, 154, 392, 308]"
    assert boxes_of(parse_boxes(text, QWEN2_5_VL, SIZE, FRAME_25)[0]) == [(200, 150, 400, 300)]
    assert boxes_of(parse_boxes(text, QWEN3_VL, SIZE, FRAME_25)[0]) == [(78, 46, 157, 92)]


# --- parse_boxes, Qwen2-VL and Qwen3-VL (0-1000 grid) ---------------------------------------


@pytest.mark.parametrize("family", GRID_FAMILIES)
def test_grid_fenced_without_language(family):
    text = '```\n[{"bbox_2d": [0, 0, 500, 500], "label": "A"}, {"bbox_2d": [500, 500, 1000, 1000], "label": "B"}]\n```'
    # A: 500*0.4 = 200, 500*0.3 = 150. B: (200, 150) to (400, 300).
    found, reason = parse_boxes(text, family, SIZE, (544, 416), "panels")
    assert reason is None and boxes_of(found) == [(0, 0, 200, 150), (200, 150, 400, 300)]
    assert [g.label for g in found] == ["A", "B"]


@pytest.mark.parametrize("family", GRID_FAMILIES)
def test_grid_bare_json_and_prose(family):
    # [250, 100, 750, 900]: 100, 30, 300, 270
    bare = '{"regions": [{"bbox_2d": [250, 100, 750, 900]}]}'
    assert boxes_of(parse_boxes(bare, family, SIZE, (544, 416), "regions")[0]) == [(100, 30, 300, 270)]
    prose = f"The arrow points at the nucleus.\n{bare}\nThe box covers it."
    assert boxes_of(parse_boxes(prose, family, SIZE, (544, 416), "regions")[0]) == [(100, 30, 300, 270)]


@pytest.mark.parametrize("family", GRID_FAMILIES)
def test_grid_truncated(family):
    text = '{"regions": [{"bbox_2d": [250, 100, 750, 900]}, {"bbox_2d": [0, 0, 1000, 5'
    found, reason = parse_boxes(text, family, SIZE, (544, 416), "regions")
    assert boxes_of(found) == [(100, 30, 300, 270)] and "cut off" in reason


@pytest.mark.parametrize("family", GRID_FAMILIES)
def test_grid_beyond_the_edge_and_swapped(family):
    # [-20, 950, 1010, 1100]: -8 -> 0, 285, 404 -> 400, 330 -> 300, clipped.
    # [750, 900, 250, 100] swapped: (100, 30, 300, 270).
    # [1001, 0, 1200, 1000]: x from 400.4 -> 400 to 480 -> 400 after clipping: empty, dropped.
    text = (
        '[{"bbox_2d": [-20, 950, 1010, 1100]}, {"bbox_2d": [750, 900, 250, 100]}, {"bbox_2d": [1001, 0, 1200, 1000]}]'
    )
    found, reason = parse_boxes(text, family, SIZE, (544, 416), "regions")
    assert boxes_of(found) == [(0, 285, 400, 300), (100, 30, 300, 270)]
    assert [g.clipped for g in found] == [True, False]
    assert reason == "dropped 1 of 3 items (1 empty or outside the image)"


@pytest.mark.parametrize("family", GRID_FAMILIES)
def test_grid_garbage_and_empty(family):
    assert parse_boxes("```json\n```", family, SIZE, (544, 416), "regions") == ([], "no JSON in answer")
    assert parse_boxes("{'regions': []}", family, SIZE, (544, 416), "regions") == ([], None)
    found, reason = parse_boxes('"just a string"', family, SIZE, (544, 416), "regions")
    assert found == [] and reason == "no JSON in answer"
