"""parlab.serve."""
