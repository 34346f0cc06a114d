"""asp.demo."""
