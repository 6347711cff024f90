"""Concepts every workload shares, defined once: the cost triple (`cost`), the compute-op helper
that turns one into trace ops (`ops`), expert routing (`routing`) and the model reference loader
(`model`). Submodules are imported explicitly: `model` pulls in torch/transformers, and
`workloads.modelcost` itself imports `cost` and `routing`.
"""
