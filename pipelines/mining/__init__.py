"""Panel2Patch mining: figure → panel → region image–text pairs from a vision-language model."""
