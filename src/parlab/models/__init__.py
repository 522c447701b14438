"""parlab.models."""
