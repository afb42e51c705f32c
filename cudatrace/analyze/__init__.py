"""analyze/: trace directory -> data: the trace reader, the replay model, call sites, what the
device observed, and the analysis base every report stands on. Never imports record/ or
present/."""
