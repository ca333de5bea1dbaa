"""Placeholder until the simulation quickstart lands."""
