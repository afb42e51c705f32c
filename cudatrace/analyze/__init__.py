"""analyze/: trace directory -> data, as a pipeline of stages, each a package that imports only
the stages before it (tests/unit/test_imports.py holds the order; docs/ARCHITECTURE.md draws
it):

    read/       a trace directory read: its files, unsealed; --aggregate snapshots; run.json
    replay/     the replay model (what was live when) and what the device observed (samples)
    sites/      call sites: stacks symbolized, CUDA's frames and allocator layers folded, names
    documents/  what is made of it: the analysis base, the report, diff, tree, ranks, the
                sweep's laws, the live figures of runs going on, and the --json documents' types

Never imports record/ or present/."""
