"""The hermes-acp benchmark: ``python bench/run.py [--quick] [--only CASES] [--write-docs]``."""
