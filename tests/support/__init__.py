"""What the tests share: trace files written by hand (tracegen), the simulated driver's build
and fixtures (simbuild, sim_fixtures), the Python replay oracle (replay_oracle), and where the
C sources the tests build live (paths). Importable as `support` (pyproject: pytest pythonpath)."""
