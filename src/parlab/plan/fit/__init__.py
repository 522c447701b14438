"""Fitting the planner's model on measured runs: a client of ``parlab.plan``, never imported by it."""
