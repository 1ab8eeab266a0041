"""The merge methods, one module each; each registers itself in :data:`landscape.merging.registry.METHODS`."""
