"""Measured figures for the site: ``python -m benchmarks NAME`` writes JSON with machine info."""
