"""Tooling around a run, never on the training path: offline assets (``python -m trainer.tools.assets``),
the launch preflight and its memory estimate, and the run artifacts (metrics log and plot).
"""
