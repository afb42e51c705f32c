"""Presenting analyzed traces: reports, diffs, pictures and exports."""
