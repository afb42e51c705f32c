"""The last stage: what is made of a run (the analysis base every report stands on, the report,
diff, tree, ranks, the sweep's laws and phrases, the live figures of runs going on), and the
`--json` documents' types. Imports the stages before it."""
