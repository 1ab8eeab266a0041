"""Frozen result classes (numpy arrays plus the spec that produced them), grouped by domain."""
