"""The asset groups, named so that Dagster's UI lists them in pipeline order.

The UI sorts groups by name; a numeric prefix makes the catalog and the lineage sidebar read
top-down the way the data flows: acquisition, parsing, metadata, concepts, panels, mining, long
captions, release, training. Every asset takes its group from here (one place to rename).
"""

ACQUISITION = "1_acquisition"
PARSING = "2_parsing"
METADATA = "3_metadata"
CONCEPTS = "4_concepts"
PANELS = "5_panels"
MINING = "6_mining"
LONG_CAPTIONS = "7_long_captions"
RELEASE = "8_release"
TRAINING = "9_training"

PIPELINE_ORDER = (ACQUISITION, PARSING, METADATA, CONCEPTS, PANELS, MINING, LONG_CAPTIONS, RELEASE, TRAINING)
