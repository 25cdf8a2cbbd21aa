"""Neural Clamping's fit: its entry and SGD optimiser, the default L-BFGS optimiser with cross-fitted stopping, and what both share."""
