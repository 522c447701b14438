"""parlab.report."""
