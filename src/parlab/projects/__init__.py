"""parlab.projects."""
