"""Geometry of the loss surface: barriers, linear paths, planes, groups of models and basins."""
