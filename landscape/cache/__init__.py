"""The HDF5 result cache: a folder of sealed entry files; content-addressed, resumable, one writer at a time."""
from .store import Cache, make_key

__all__ = ["Cache", "make_key"]
