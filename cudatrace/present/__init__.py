"""Presentation: data -> text, JSON, pictures (the report, diff, HTML)."""
