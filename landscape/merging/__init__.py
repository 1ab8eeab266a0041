"""Model merging checked on the loss landscape (``landscape.merge``, ``docs/merging.md``).

* :mod:`.registry` -- :class:`~.registry.MergeMethod` and :data:`~.registry.METHODS`; the methods,
  one module each, are in :mod:`.methods` (mean, greedy soup, task arithmetic, TIES, DARE, SLERP);
* :mod:`.sources` -- the models as tensors read one at a time (``.safetensors`` lazily);
* :mod:`.merge` -- :func:`~.merge.merge`, tensor by tensor; :mod:`.measure` -- the merge's loss,
  barriers to the endpoints and curvature; :mod:`.options` -- :class:`~.options.MergeOptions`.

This layer sits above :mod:`landscape.connectivity` (it uses the evaluator, paths, curvature and
alignment) and below :mod:`landscape.claims`.
"""
