"""Trace directory -> data: the model, sites, and the laws a sweep fits."""
