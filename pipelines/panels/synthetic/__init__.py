"""Synthetic compound figures with exact panel and panel-label boxes, to train the panel detector.

Real single-panel figures are composed into compound figures whose ground truth is known by
construction. Compared with a grid-only generator (Open-PMC-18M: m x n grids, one default
font, fixed aspect ratio, unseeded workers):

* **Reproducible per sample.** Sample ``index`` of split ``split`` draws everything from
  ``random.Random(sample_seed(seed, split, index))`` (a 64-bit blake2b of
  ``"{seed}:{split}:{index}"``), so any sample can be made alone, in any worker, in any order,
  byte for byte (same source list, same library versions).
* **Layouts beyond grids**, as a guillotine tree written in a small spec language: ``P`` is a
  panel, ``Pi`` a panel carrying an inset (a zoomed part of itself with a zoom box and
  connector lines), ``R[...]`` stacks its children top to bottom, ``C[...]`` puts them side by
  side. Rows with different column counts (``R[C[P,P,P],C[P,P]]``), spanning panels
  (``R[P,C[P,P]]``: the first spans two columns; ``C[P,R[P,P]]``: it spans two rows) and
  nested grids (a cell split again) are all trees. Sources keep their aspect ratio: each is
  letterboxed inside its cell; cell weights follow the sources' own aspect ratios, mixed with
  equal weights by a random amount.
* **Insets are panels**: they are annotated as category ``panel`` with ``inset: true`` and the
  id of the panel they sit in (``parent_id``). Our post-processing, like Open-PMC-18M's, keeps
  a panel contained in another (containment suppression spares insets), so the detector must
  see them as panels.
* **Panel labels in PMC's styles** (A, a, (A), (a), A), a), A., a., 1, (1), 1., i, (i), A1/A2),
  bold or regular, in DejaVu Sans/Serif/Mono and STIX (fonts matplotlib ships), sized relative
  to the figure, inside a corner of the panel or outside above or left of it, plain or in a
  white or black box. The glyph box of each label is annotated as category ``panel_label``.
* **Distractors** drawn inside panels and not annotated: legends, colour bars, scale bars with
  their text (``10 µm``), text blocks, arrows.
* **Degradation**: optional intermediate JPEG pass, random downscaling (boxes scaled with the
  image), and the final JPEG at a random quality.

The package follows those seams, one module each:

=================  ===========================================================================
``generate``       :func:`generate_sample`: the order of the draws (the reproducibility
                   contract), :class:`GeneratorConfig`, :class:`Sample`
``seeds``          the per-sample seed and the hash-derived draws
``layout``         the layout language, random layouts, the cells a layout gives
``labels``         label texts, fonts and one figure's label style
``draw``           pasting panels, drawing labels and insets (what is annotated)
``distractors``    legends, colour bars, scale bars, text, arrows (not annotated)
``degrade``        JPEG passes and downscaling, boxes scaled with the image
``sources``        the source panels: decoding, caching, picking them from the lake
``splits``         train/val assignment of sources, near-duplicates dropped from val
``coco``           :func:`write_coco_dataset`: the COCO files, streamed
=================  ===========================================================================

:func:`write_coco_dataset` streams a COCO dataset per split (train, val) to disk, holding one
image at a time, after de-duplicating source panels between the splits by the project's dHash
(:func:`pipelines.images.info.dhash`, pairs found by :func:`pipelines.images.duplicates.find_duplicates`).
:func:`source_panels` picks single-panel figures from the lake with their licences. Both, and
what tests and benchmarks use, are importable from ``pipelines.panels.synthetic`` itself.
"""

from pipelines.panels.synthetic.coco import CATEGORIES, PANEL, PANEL_LABEL, write_coco_dataset
from pipelines.panels.synthetic.generate import GENERATOR_VERSION, GeneratorConfig, Sample, generate_sample
from pipelines.panels.synthetic.labels import FONTS, label_texts
from pipelines.panels.synthetic.layout import (
    LAYOUT_KINDS,
    Leaf,
    Node,
    Split,
    count_panels,
    format_layout,
    leaves,
    parse_layout,
    random_layout,
)
from pipelines.panels.synthetic.seeds import sample_seed
from pipelines.panels.synthetic.sources import SINGLE_PANEL, SourceCache, SourcePanel, load_source, source_panels
from pipelines.panels.synthetic.splits import split_sources

__all__ = [
    "CATEGORIES",
    "FONTS",
    "GENERATOR_VERSION",
    "LAYOUT_KINDS",
    "PANEL",
    "PANEL_LABEL",
    "SINGLE_PANEL",
    "GeneratorConfig",
    "Leaf",
    "Node",
    "Sample",
    "SourceCache",
    "SourcePanel",
    "Split",
    "count_panels",
    "format_layout",
    "generate_sample",
    "label_texts",
    "leaves",
    "load_source",
    "parse_layout",
    "random_layout",
    "sample_seed",
    "source_panels",
    "split_sources",
    "write_coco_dataset",
]
