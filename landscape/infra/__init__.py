"""Infrastructure shared by the whole toolkit.

Errors, atomic and link-safe file writes, parallel back ends, digests and devices. ``fl`` and
``figures`` may import it without loading the analysis core.
"""
