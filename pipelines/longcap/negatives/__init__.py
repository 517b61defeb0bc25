"""Hard-negative captions for region pairs: the region's text with exactly one attribute changed.

RegionMed-CLIP (shared/papers/002, "Text Encoding and Multi-Level Annotations" and "ROI Processor:
Region Alignment and Hard Negative Mining") trains its ROI processor with, for every region
caption, several negative captions made "by perturbing relevant terms in the region captions",
"subtly modifying clinical terms" so that the negative is clinically similar yet false; its
Appendix B ("Negative Sample Generation") has Qwen2.5-VL-72B write five alternative shape or
appearance adjectives, "systematically varying texture, color, shape, or location". We do the same
on caption clauses anchored to arrows and on VLM region descriptions, with two differences:

* rules come first (a lexicon of opposite values, per attribute), the VLM is an option; every
  negative says which attribute it changes (laterality, location, count, colour, stain, modality,
  size), so a trainer can weigh or ablate the kinds;
* a negative must never be a true statement about the region, because a true "negative" teaches
  the model to push the right text away. :func:`is_contradiction` is the one gate, for rule and
  VLM negatives alike: the negative must claim a value of the attribute that the positive does
  not claim (so "left and right ventricles" cannot become "right and right ventricles"), must not
  change any other attribute, and must keep the rest of the sentence.

Matching is by whole words (never "bright" -> "bwrong"), case is kept ("Left" -> "Right"), and
phrases where a word is not the attribute ("white matter", "Congo red", "if left unchanged",
"lower than", "small intestine") are protected. A lexicon cannot read every sentence, so it errs
towards making no negative: an unrecognised value is unverifiable and rejected.
"""

from pipelines.longcap.negatives.counts import NUMBER_WORDS
from pipelines.longcap.negatives.gate import MIN_KEPT, RULE, VLM, Negative, is_contradiction, rejection, values
from pipelines.longcap.negatives.lexicon import (
    COLOUR,
    COUNT,
    KINDS,
    LATERALITY,
    LOCATION,
    MODALITY,
    SIZE,
    STAIN,
    TERMS,
)
from pipelines.longcap.negatives.rows import negative_rows, pair_negatives
from pipelines.longcap.negatives.rules import RULES_VERSION, rule_negatives
from pipelines.longcap.negatives.vlm import NEGATIVES, NEGATIVES_PROMPT_VERSION, VlmNegatives, vlm_negatives

__all__ = [
    "COLOUR",
    "COUNT",
    "KINDS",
    "LATERALITY",
    "LOCATION",
    "MIN_KEPT",
    "MODALITY",
    "NEGATIVES",
    "NEGATIVES_PROMPT_VERSION",
    "NUMBER_WORDS",
    "RULE",
    "RULES_VERSION",
    "SIZE",
    "STAIN",
    "TERMS",
    "VLM",
    "Negative",
    "VlmNegatives",
    "is_contradiction",
    "negative_rows",
    "pair_negatives",
    "rejection",
    "rule_negatives",
    "values",
    "vlm_negatives",
]
