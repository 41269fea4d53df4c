"""Run configuration: the sections, their options and loading; imports no torch."""
