"""Sampling a step's responses: engines, the rollout batch, group filtering, chain trees."""
