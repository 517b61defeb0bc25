"""Long captions (BIOMEDICA-LongCAP): captions enriched with their article's context, verified
against the image; and hard-negative captions for region pairs (RegionMed-CLIP)."""
