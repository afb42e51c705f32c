"""record/: what `cudatrace run` needs: the launcher, the sampler, the budget spec and the
ledger binding. Never imports analyze/ or present/."""
