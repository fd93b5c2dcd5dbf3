"""Measured figures for the site: ``python -m reference_impl.bench NAME`` writes JSON with machine info."""
