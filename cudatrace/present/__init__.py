"""present/: data -> text, JSON and SVG: report, diff, the run summary, status, plot. Never
imports record/ or the command line."""
