"""Diagnostics a user runs before and after training.

``debug_data`` (what the data holds and what in it will
hurt), ``diagnose`` (what a trained model does inside: norms, attention, saturation, gates, padding, time) and
``overfit`` (can the model fit one small batch, and does the saved model give the same predictions)."""
