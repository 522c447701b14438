"""parlab.plan."""
