"""The HDF5 result cache: content-addressed, resumable, one writer at a time."""
from .store import Cache, make_key

__all__ = ["Cache", "make_key"]
