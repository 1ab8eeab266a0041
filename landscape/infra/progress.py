"""Progress bars: tqdm's notebook widget where Jupyter can draw it, its text bar everywhere else.

``tqdm.auto`` picks the widget in any Jupyter kernel and, without ``ipywidgets`` installed, warns
``TqdmWarning: IProgress not found`` and prints nothing useful; the text bar works in every kernel.
"""
from __future__ import annotations

from importlib.util import find_spec
from typing import Any


def progress_bar(*args: Any, **kwargs: Any) -> Any:
    """A ``tqdm`` bar: the notebook widget when ``ipywidgets`` is installed, else the text bar.

    Parameters
    ----------
    *args, **kwargs
        Passed to ``tqdm`` (an iterable, ``total``, ``desc``, ``disable``, ...).

    Returns
    -------
    tqdm.tqdm
        The bar (usable as an iterator and a context manager).
    """
    if find_spec("ipywidgets") is None:
        from tqdm.std import tqdm
    else:
        from tqdm.auto import tqdm
    return tqdm(*args, **kwargs)
