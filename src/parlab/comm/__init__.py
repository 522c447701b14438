"""parlab.comm."""
