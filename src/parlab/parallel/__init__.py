"""parlab.parallel."""
