"""Discrete-event simulator of the ASP runtime."""
