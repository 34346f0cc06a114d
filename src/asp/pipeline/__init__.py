"""asp.pipeline."""
