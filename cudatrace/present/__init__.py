"""Data -> text, JSON and pictures."""
