"""The study: what the notebooks use, on top of the engine and the workloads.

``experiments`` (the embedding notebooks' experiments) and ``binning`` (the binning notebook's),
each returning tidy tables; ``findings`` (one sentence per figure, computed from its table),
``plots`` and ``figures`` (drawing and saving); ``results`` (tables with provenance sidecars),
``provenance``, ``parameters`` (the notebooks' parameter sets, checked), ``notebooks`` (the papermill
runner) and ``paths`` (where the checkout keeps its data, figures and notebooks).
"""
