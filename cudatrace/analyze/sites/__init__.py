"""The third stage: call sites (stacks symbolized, CUDA's own frames folded, allocator layers
recognized from the call graph, short names; allocations grouped). Imports only read/ and
replay/."""
