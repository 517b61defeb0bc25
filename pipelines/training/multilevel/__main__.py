"""``python -m pipelines.training.multilevel --config config.json`` (and under torchrun)."""

from pipelines.training.multilevel.job import main

if __name__ == "__main__":
    main()
