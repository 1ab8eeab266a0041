"""Parameter spaces: models as flat vectors (:class:`ParameterSpace`), point sets, and checkpoint loading."""
