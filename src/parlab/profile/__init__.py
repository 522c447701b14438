"""parlab.profile."""
