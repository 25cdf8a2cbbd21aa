"""Streamed calibration data: the user's object read as numbered units, indexed after a first pass and served by plan, and how each kind of stream becomes batches."""
