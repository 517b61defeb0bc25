"""Jobs, schedules, sensors, partitions and the code location's ``Definitions``."""
